"""Jobs: the stages wired together. :mod:`~pipeline.jobs.online` is ``streamtrain run``
(replay, stream, train, checkpoint, report); :mod:`~pipeline.jobs.trainer` is the batch
API, ``Trainer(model).train(data)``."""
