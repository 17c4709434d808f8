"""Every assumption ``trainers`` makes about RLlib's (and Ray's) private internals, in one place.

RLlib's private attributes and methods (a leading ``_``) change between releases without
notice. The project touches them only through this package — each access a small named
function whose docstring names the RLlib 2.60 internal it relies on — and each assumption is
pinned by a test in ``tests/test_rllib_compat.py`` on real RLlib objects, so an upgrade that
breaks one fails there, naming it. ``tests/test_rllib_compat.py`` also greps the four packages
for private RLlib/Ray names used anywhere else.

* :mod:`~trainers.rllib_compat.runner`: env runner state the batched sampler, the async GRPO
  pipeline and exact resume read and write (ongoing episodes, metrics lock, Prometheus step
  counter, the vector env's autoreset flags, the algorithm's ``_time_total``), the episode
  class swap, and the private runner methods ``BatchedEnvRunner`` overrides or calls.
* :mod:`~trainers.rllib_compat.episodes`: the ``SingleAgentEpisode`` / ``MultiAgentEpisode`` /
  ``InfiniteLookbackBuffer`` fields the fast episode builder writes directly.
* :mod:`~trainers.rllib_compat.learner`: the learner's optimiser and module registries, the
  ``MiniBatchCyclicIterator`` fields, ``MultiRLModule``'s module dict, the private learner
  methods the lean learner overrides, and RLModule's ``_forward*`` hooks.
* :mod:`~trainers.rllib_compat.distributions`: the torch distribution inside RLlib's
  distribution objects.
* :mod:`~trainers.rllib_compat.ray_private`: Ray's private modules (the GCS probe, the driver's
  ``sys.path``, the Tune trial session).

Overriding a private method in a subclass stays where the subclass is; the method is listed in
``OVERRIDDEN`` (and private members a subclass uses through ``self`` in ``INHERITED``) of the
module above, and the test pins that RLlib's class has it with the expected signature.
"""

from __future__ import annotations

#: the RLlib (Ray) release whose internals this package pins; pyproject allows ``2.60.x`` only
RAY_VERSION = "2.60"
