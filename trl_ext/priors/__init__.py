"""Value priors for V0.5 and the support buffer.

Source: "V0.5: Generalist Value Model as a Prior for Sparse RL Rollouts", arXiv:2603.10848, End-to-End
Implementation Workflow, Step 1.

- :class:`ValuePrior` -- the interface: ``predict(target_prompts, context_prompts, context_outcomes) -> p``.
- :class:`EmbeddingInContextPrior` (+ :func:`hf_mean_pool_embedder`, heads in :mod:`.heads`) -- V0-style.
- :class:`TablePrior` -- offline per-prompt success rates; file format in :mod:`.table_format`.
- :class:`CallablePrior` -- wrap any function (``CallablePrior.from_v0`` for the official V0).
- :class:`ConstantPrior` -- the no-information ablation.
- :class:`SupportBuffer` -- global FIFO of (prompt, outcome) pairs with deterministic context sampling.
- :func:`build_prior` -- factory by name.

No TRL import here; ``torch`` is imported only inside :func:`hf_mean_pool_embedder`.
"""

from . import base, callable_prior, embedding, factory, heads, support_buffer, table, table_format, value_table
from .base import *  # noqa: F401,F403
from .callable_prior import *  # noqa: F401,F403
from .embedding import *  # noqa: F401,F403
from .factory import *  # noqa: F401,F403
from .heads import *  # noqa: F401,F403
from .support_buffer import *  # noqa: F401,F403
from .table import *  # noqa: F401,F403
from .table_format import *  # noqa: F401,F403
from .value_table import *  # noqa: F401,F403

__all__ = [
    *base.__all__,
    *callable_prior.__all__,
    *embedding.__all__,
    *factory.__all__,
    *heads.__all__,
    *support_buffer.__all__,
    *table.__all__,
    *table_format.__all__,
    *value_table.__all__,
]
