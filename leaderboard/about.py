"""The About page: what the numbers mean and how results get onto the board (Markdown)."""

from __future__ import annotations

from kvbench.results.stats import DRAWS

ABOUT = f"""
### What is compared

Every policy is a **scorer**: at an eviction event it scores the cached tokens of one layer, and the
engine keeps the best ones. Everything else is the protocol's, identical for every policy in a table:

- **Budget K**: the cache length per layer and KV head right after an eviction, the buffer included. A
  ratio budget (`4x`) sets K = N_avg / 4, rounded to a multiple of B (at least 2B); N_avg is the full
  cache's mean generated length on the same problems (a probe's trace length). K/N_avg in the table is
  the share actually used.
- **Buffer B** (64 by default): the B newest tokens are never candidates. A layer evicts when it holds
  more than K slots and the excess is a multiple of B, so the cache grows from K to K + B between events.
- **Prompt protection**: under `protect-prompt` the whole prompt is always kept (other protocols keep
  the first n tokens, or nothing); the policy chooses among the generated tokens only.
- **Seeds**: each sample's seed derives from (protocol seed, task, problem, sample), each eviction
  draw from (sample seed, layer, event). A policy and the null see the same problems with the same seeds.

Tables compare arms within one model, protocol, runtime (adapter/device/dtype/attention), protocol seed
and compression.

### The null: Random Attention

The baseline every policy must beat keeps a uniformly random subset of the candidates, independently
per KV head and layer, under the same protection, budget and buffer. A scorer that does not beat it
shows no evidence that its scores carry information about which tokens matter. The **full cache**
(no eviction) is the ceiling.

### Statistics

- A cell is the mean over problems of each problem's mean over its samples (pass@1 for graded tasks,
  the probe's metric otherwise), with a 95% percentile bootstrap interval over problems
  ({DRAWS:,} draws; a problem's samples are resampled together).
- **Δ vs null** pairs the two arms on the problems both ran (pooled tasks: on (task, problem) clusters):
  the mean paired difference with its 95% interval — exact for a pass/fail metric with one sample per
  problem, a studentized (bootstrap-t) interval otherwise; scores within 1e-9 are a tie, and a row
  where no problem differs says so.
- The **verdict**: *beats null* or *loses* when an exact two-sided sign test on the problems where the
  arms differ (wins against losses) and the test of Δ that its interval inverts both reject in the same
  direction, **Holm-corrected** at α = 0.05 within a family, which the page lists under the table: a
  task's verdicts across the policies of that task's table (one task at one budget), a pooled column's
  across the policies of that pool — a family of its own, which the per-task columns are not in, so no
  comparison is counted in two families. *equivalent* when two one-sided tests put Δ inside ±margin,
  in the metric's units: the margin the task declares for that metric (`margins` in its spec), else
  the protocol's for a metric scored in [0, 1], else none (exact for pass/fail; bootstrap-t, and never
  under 30 problems, otherwise; Holm-corrected the same way);
  *practically equivalent* when both decide (it differs from the null by less than the margin); and
  *inconclusive* when neither test decides: beside it, the problems that would give a decided verdict
  80% power at the observed paired differences, and which verdict ("23 problems to beat", "35 problems
  to be equivalent"), or "no problem differs" where more problems of that probe cannot separate the
  arms. *MDE* is the smallest effect the table's problems detect with 80% power ("none": 4 problems
  give a smallest p of 0.125, so none). Problems present in only one arm are left out and counted.
- **Tokens × full**, **tokens / correct**, **Δ tokens** and **Δ trunc vs null**: what compression costs
  in generated tokens (a reasoning model that loses context thinks longer): mean generated tokens over
  the full cache's on the same problems, generated tokens per correct answer, and the paired
  differences of mean tokens and of the share stopped at the token cap to the null.
- The *average* pools the tasks every arm of the table ran; where the table mixes tasks with a
  correct/incorrect verdict per sample (exact match, pass@1) and continuous metrics (fidelity's
  agreement with the full cache), each kind is also averaged on its own.
- **Head-to-head** applies the same paired machinery to any two arms of a table, per task (p-values
  Holm-corrected across the tasks shown) and pooled.

### Submitting results

1. Run kvbench on your policy (`kvbench run ...`, the null and the full cache come with it), then pack
   the runs: `kvbench export my-policy.kvbench.tar.gz --policy NAME --submitter "name, contact"`
   (`--scorer FILE` ships the source of a policy that is not built in).
2. Send the bundle to the maintainers.
3. A maintainer checks it against every rule and adds it to the board: `kvbench accept BUNDLE --db PATH`.
   It is then listed as *pending*, with no score.
4. `kvbench verify DIGEST --db PATH` re-computes every problem and sample of each run on the maintainer's
   machine. A run re-computed whole is published with the maintainer's numbers (*re-computed*; marked
   where they differ from the bundle's claim); a run that cannot be re-computed there (its scorer
   fails, hangs or breaks a limit) is *failed* and never counted. Provenance names the machine.
5. `kvbench withdraw DIGEST --db PATH --reason ...` takes a submission off the board.

Rows marked *local* come from runs no submission holds.
"""
