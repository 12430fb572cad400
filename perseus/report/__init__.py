"""Plots and the HTML report: the only package that imports matplotlib."""

from perseus.report.build import REPORT_FILES, ReportInputs, write_report
from perseus.report.summary import MeasuredRun, Summary, format_summary, summarize

__all__ = [
    "REPORT_FILES",
    "MeasuredRun",
    "ReportInputs",
    "Summary",
    "format_summary",
    "summarize",
    "write_report",
]
