"""Pretraining data: sentencepiece tokenizer (``tokenizer``), corpus discovery and pieces (``paths``), readers
(``files``), per-(rank, worker) document streams (``stream``), the metadata-only job plan (``plan``), ALBERT SOP +
n-gram-masked examples (``pretraining``), the resumable training loader the
engine calls (``loader.build_train_loader``) and the fixed validation set with its unigram baseline
(``validation``), configured by ``config.DataConfig``."""
