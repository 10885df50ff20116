"""The report step shared by every study: the loader of saved tables, one markdown renderer, one
claims engine, the summary builder."""

from .claims import LABELS, judge
from .markdown import format_interval, format_number, markdown_table
from .saved import Saved, load
from .summary import build_summary, write_report

__all__ = ["Saved", "load", "write_report", "build_summary", "markdown_table", "format_number", "format_interval", "judge", "LABELS"]
