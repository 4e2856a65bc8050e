"""Analysis of recurrent states and key-channel selections (paper section 2.2, appendix C.2, Tables 5-6, Figure 7)."""

from state_reduction.analysis.rank import effective_rank, rank_utilization

__all__ = ["effective_rank", "rank_utilization"]
