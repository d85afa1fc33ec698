"""Encoder tuning, the only torch in :mod:`training` (imported inside functions).

- :mod:`~training.tuner.finetune`: the :class:`EncoderTuner` (contrastive fine-tuning of the base encoder)
- :mod:`~training.tuner.adapter_trainer`: an adapter trained on a fixed encoder's vectors
- :mod:`~training.tuner.export`: tune (or adapt), export to ONNX and serve the export (:func:`tune_and_export`)
- :mod:`~training.tuner.unlabelled`: the unlabelled stage: contrastive pretraining on logged queries
- :mod:`~training.tuner.step`: the retrain's tuning step: its rows, hard pairs, budget and re-encoding
- :mod:`~training.tuner.fit`: layer 2 fitted on a tuned encoder (:func:`train_tuned`: train, eval and retrain)

Nothing is imported here, so importing the package loads no model library.
"""
