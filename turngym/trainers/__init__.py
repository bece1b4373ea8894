"""Learning: one file per algorithm (its config, its loss, its update), registered by name.

Importing the package registers every algorithm (``registry.algorithm_names()``), in this order:
branch BC (``branch_bc.py``), ArCHer (``archer.py``) and the critic-free family (``pg.py`` with
``grpo.py``, ``gigpo.py``, ``rloo.py``, ``reinforce.py``, ``filtered_bc.py``). SFT (``sft.py``) is
the warm start before them; it shares its likelihood update (``likelihood.py``) with branch BC.
"""

from turngym.trainers import branch_bc  # noqa: F401  (each algorithm module registers itself)
from turngym.trainers import archer  # noqa: F401,I001
from turngym.trainers import grpo  # noqa: F401,I001
from turngym.trainers import gigpo  # noqa: F401,I001
from turngym.trainers import rloo  # noqa: F401,I001
from turngym.trainers import reinforce  # noqa: F401,I001
from turngym.trainers import filtered_bc  # noqa: F401,I001
