"""An app with a bounded queue, for the CLI backpressure test (``tests.e2e.bounded_app:app``)."""

from conveyor import App

app = App()
app.queue("bounded", max_depth=2, shedding={"low": 1.0, "normal": 1.0, "high": 1.0})
