"""Learning: one file (or package) per algorithm (its config, its loss, its update), registered by name.

Importing the package registers every algorithm (``registry.algorithm_names()``), its config section
and any pipeline stage (``stages``), in this order: SFT (``sft.py``, the warm start), branch BC
(``branch_bc.py``), ArCHer (``archer/``: the paper in ``core.py``, its variants as plug-ins) and the
critic-free family (``pg.py`` with ``grpo.py``, ``gigpo.py``, ``rloo.py``, ``reinforce.py``,
``filtered_bc.py``). SFT and branch BC share their likelihood update (``likelihood.py``).
"""

import importlib
import pkgutil

from turngym.trainers import sft  # noqa: F401  (its section comes first)

# every module and package of this folder registers what it holds: a new algorithm is one new file
for _info in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_info.name}")
