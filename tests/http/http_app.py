"""The App the HTTP tests serve with --app: its queue policies apply to HTTP sends (backpressure)."""

from __future__ import annotations

from conveyor import App

app = App()
app.queue("tight", max_depth=3)  # normal priority is refused at 80 %: the third live job
