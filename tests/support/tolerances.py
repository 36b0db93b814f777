"""The float bounds the tests hold numbers to, each with where it comes from. What moves a
number between two runs of the same math is the order its sums are taken in (and, on CPU,
which oneDNN kernel a shape gets: docs/contributing.md runs the sensitive tests under other
instruction sets); nothing here is read off one machine.

- SAME_ORDER: two runs that take every sum in the same order (a resumed run against the
  uninterrupted one, on one layout): bitwise equal in fact; 1e-6 leaves room only for a
  value's trip through JSON.
- SUM_ORDER: fp32 training losses (near 4) of runs whose sums are grouped otherwise (an
  all-reduce over ranks against one process's accumulation, shards' partial norms, a
  pipeline's stages): each such sum differs by an ulp or two (2.4e-7 at 4), which the
  optimizer carries into later steps. Measured: at most 2.4e-7 over 8 steps at every
  layout, the same under six oneDNN instruction-set caps; the bound is 40x that, and a
  layout that splits the math wrong moves the losses by over 1e-3.
- LOGITS: fp32 logits of one model computed by two implementations (raytrain's blocks
  against transformers', a folder written and read back): the same products summed in
  another order by different kernels, a few ulps of values of order 1-10.
"""

from __future__ import annotations

SAME_ORDER = 1e-6
SUM_ORDER = 1e-5
LOGITS = 1e-5
