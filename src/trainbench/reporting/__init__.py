"""From results to what a reader sees: the column registry (`columns`) and the models' predictions
beside each result (`predictions`), a study's answer in words and its summary table (`answer`), tables in
markdown and CSV (`tables`), findings judged against the results (`findings`), plots (`plots`), the
report (`report`), reference figures (`references`), every cell as one dataset (`dataset`), comparisons
between result trees (`compare`), progress of a run and a grid's cost (`progress`) and whether a result is
current (`freshness`); results as documents for the modules that do not read `Result` yet (`documents`).
Results are read through `contract.result`, never through `execute`.

May import: every stage below it but `execute` (`registry`, `study`, `contract`, `predict`,
`training`); nothing imports it but the command line (`trainbench.cli`, `trainbench.fit`) and the
workflow layer (`trainbench.workflow`).
"""
