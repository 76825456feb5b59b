"""lm-evaluation-harness both ways: kvbench as an lm-eval model (``model``), and lm-eval tasks as a
kvbench task source (``tasks``). Nothing is registered on import: :func:`kvbench.lmeval.model.register`
(or ``kvbench lm-eval``) makes ``--model kvbench`` known to lm-eval."""
