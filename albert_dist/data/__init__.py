"""Pretraining data: sentencepiece tokenizer (``tokenizer``), corpus discovery and per-(rank, worker) document
streams (``sources``), ALBERT SOP + n-gram-masked examples (``pretraining``) and the resumable loaders the engine
calls (``loader.build_train_loader`` / ``loader.build_eval_loader``), configured by ``config.DataConfig``."""
