"""The long-context study's per-method table, the same for the cache policies (``policies.csv``) and the
whole-sequence methods (``whole_methods.csv``).

Public API::

    method_table(frame, **extra) -> DataFrame   # per length, method and ratio
"""

from __future__ import annotations

import pandas as pd

__all__ = ["method_table"]

BY = ["length", "method", "compression_ratio"]


def method_table(frame: pd.DataFrame, **extra) -> pd.DataFrame:
    """Per length, method and ratio of the method rows ``frame`` (a failed row's ``status`` is not ``"ok"``): the
    median budget, sequences, accuracy, mean losses (answer log-prob, all-token and key-token Delta NLL), median
    clean- and patched-input error (and ``clean_worst_head``, the worst head's, where the rows record it), median
    seconds, then ``extra`` (pandas named aggregations) and the failures."""
    frame = frame.assign(ok=frame["status"] == "ok")
    worst = {}
    if "clean_spectral_worst_head" in frame and frame.loc[frame["ok"], "clean_spectral_worst_head"].notna().all():
        worst = {"clean_worst_head": ("clean_spectral_worst_head", "median")}
    table = frame[frame["ok"]].groupby(BY, sort=False).agg(
        num_features=("num_features", "median"), sequences=("text", "size"), accuracy=("correct", "mean"),
        delta_logprob=("delta_logprob", "mean"), delta_all=("delta_all", "mean"), delta_key=("delta_key", "mean"),
        clean_spectral=("clean_spectral_mean", "median"), patched_spectral=("patched_spectral_mean", "median"),
        **worst, seconds=("seconds", "median"), **extra).reset_index()
    failures = frame.groupby(BY, sort=False)["ok"].agg(lambda s: int((~s).sum())).rename("failures").reset_index()
    return table.merge(failures, on=BY, how="right")
