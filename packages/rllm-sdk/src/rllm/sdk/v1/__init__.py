"""V1: parallel generation ranked by pairwise self-verification in a tournament.

The same model writes N candidates and then judges pairs of them ("which of A and B is
correct?"); a tournament (Swiss rounds, a knockout bracket or all pairs) spends a fixed budget
of such calls and ranks the candidates. Majority vote is the baseline. Pure agent-side code:
the tournament, the verdict parser and majority vote need nothing; ``solve_v1`` needs the
``openai`` extra; ``v1_credit`` rewards both roles' calls so they train jointly.
"""

from rllm.sdk.v1.credit import NO_SIGNAL_SUFFIX, V1Credit, report_keys, split_role, v1_credit
from rllm.sdk.v1.majority import MajorityResult, majority_vote
from rllm.sdk.v1.match import Comparison, Verifier
from rllm.sdk.v1.solve import V1Outcome, V1Settings, prompt_key, solve_v1
from rllm.sdk.v1.tournament import FORMATS, TournamentFormat, TournamentResult, allocate, run_tournament
from rllm.sdk.v1.verdict import VERIFY_INSTRUCTION, Verdict, pairwise_messages, parse_verdict

__all__ = [
    "FORMATS",
    "NO_SIGNAL_SUFFIX",
    "VERIFY_INSTRUCTION",
    "Comparison",
    "MajorityResult",
    "TournamentFormat",
    "TournamentResult",
    "V1Credit",
    "V1Outcome",
    "V1Settings",
    "Verdict",
    "Verifier",
    "allocate",
    "majority_vote",
    "pairwise_messages",
    "parse_verdict",
    "prompt_key",
    "report_keys",
    "run_tournament",
    "solve_v1",
    "split_role",
    "v1_credit",
]
