"""``python -m conveyor.pipeline export|report|reconcile|enqueue``: the pipeline without the main CLI."""

from conveyor.pipeline.cli import main

if __name__ == "__main__":
    main(prog_name="python -m conveyor.pipeline")
