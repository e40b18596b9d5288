"""taugrid-evidence from a notebook: `explain(...)` and `query(...)` answer as pandas DataFrames.

    import taugrid_evidence as te
    ex = te.explain("llm-sft", namespace="research")     # live, with your kubeconfig (or from_dump=, controller=)
    ex.claims                                            # one row per run and claim
    te.query("goodput_by_queue_team")                    # a queries/ KQL on the embedded store (or adx=)

`explain` is the `explain` command's engine (live, from a dump or from the controller), `query` the
`query` command's; their rows are the same as those commands print.
"""

from taugrid_evidence.api import ExplainError, Explanation, explain, query

__all__ = ["ExplainError", "Explanation", "explain", "query"]
