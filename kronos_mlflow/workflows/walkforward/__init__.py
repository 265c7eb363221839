"""Walk-forward: fine-tune and judge fold after fold, one verdict over every test period.

``folds`` (the fold table: each fold's training, validation and test periods), ``aggregate``
(the folds' scorecards pooled into one verdict, its picture and summary) and ``command``
(``kronos-mlflow walk-forward``: one parent run, one pipeline per fold). docs/walk-forward.md.
"""
