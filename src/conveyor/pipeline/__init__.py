"""The data pipeline: export the job history to Parquet and analyse it with Spark.

``export`` needs only pyarrow; everything else runs on PySpark (the ``pipeline`` extra). The
pipeline reads exports (or a database through the public producer API); it is never a Backend.
"""

from __future__ import annotations

from conveyor.pipeline.enqueue import EnqueueResult, enqueue_dataframe
from conveyor.pipeline.errors import PipelineError
from conveyor.pipeline.export import ExportResult, Watermark, export, read_watermark
from conveyor.pipeline.reconcile import ReconcileResult, reconcile
from conveyor.pipeline.report import ReportResult, report
from conveyor.pipeline.spark import get_session

__all__ = [
    "EnqueueResult",
    "ExportResult",
    "PipelineError",
    "ReconcileResult",
    "ReportResult",
    "Watermark",
    "enqueue_dataframe",
    "export",
    "get_session",
    "read_watermark",
    "reconcile",
    "report",
]
