"""bench_turn's parts, split by concern.

* :mod:`workload`: the plan (how many turns of what), the tokenizer rule, the data;
* :mod:`systems`: the floors and the ctxguard rows (what one turn of each does);
* :mod:`peers`: LangChain and LlamaIndex;
* :mod:`meters`: round trips, top-level commands, INFO commandstats deltas per turn;
* :mod:`report`: the targets and the printed table.

``bench_turn.py`` runs them: load, one interleaved timeline, report.
"""
