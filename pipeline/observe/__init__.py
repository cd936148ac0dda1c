"""Observe: Prometheus metrics (declared once, in :mod:`~pipeline.observe.metrics`), the
Grafana dashboard (:mod:`~pipeline.observe.dashboard`), and pictures of a run or of the
dashboard without Grafana (:mod:`~pipeline.observe.plots`)."""
