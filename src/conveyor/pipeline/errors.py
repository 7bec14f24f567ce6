"""The pipeline's one exception: bad input or a state the pipeline cannot work from."""

from __future__ import annotations

from conveyor._errors import ConveyorError


class PipelineError(ConveyorError):
    """A pipeline job cannot run: a missing or malformed input, a bad option, a locked export.

    The message is one line meant for the operator; the CLI prints it without a traceback."""
