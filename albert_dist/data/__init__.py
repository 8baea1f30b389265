"""Pretraining data: sentencepiece tokenizer (``tokenizer``), corpus discovery and per-(rank, worker) document
streams (``sources``), ALBERT SOP + n-gram-masked examples (``pretraining``), the resumable training loader the
engine calls (``loader.build_train_loader``) and the fixed validation set with its unigram baseline
(``validation``), configured by ``config.DataConfig``."""
