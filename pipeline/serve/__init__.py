"""Serving the model a run trains: TensorFlow Serving's REST API over the live center
(``run --serve-port``) or a run's checkpoint (``streamtrain serve``), and the predict
stream (``streamtrain predict``). Only the serving process imports TensorFlow."""
