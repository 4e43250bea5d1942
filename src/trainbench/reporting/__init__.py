"""From results to what a reader sees: the column registry (`columns`) and the models' predictions
beside each result (`predictions`), tables in markdown and CSV (`tables`), findings and reference
figures judged against the results (`findings`, `references`), plots (`plots`), the report (`report`),
every cell as one dataset (`dataset`), comparisons between result trees (`compare`), a grid's cost
(`cost`), progress of a run (`progress`) and whether a result is current (`freshness`).

May import: every stage below it (`registry`, `study`, `predict`, `training`, `execute`); nothing
imports it but the command line (`trainbench.cli`, `trainbench.fit`) and the workflow layer
(`trainbench.workflow`).
"""
