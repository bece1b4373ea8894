"""ArCHer: the paper's algorithm (``core.py``) and its plug-ins (one file each, ``plugins.py``).

Importing the package registers the algorithm ``archer`` and every plug-in.
"""

from turngym.trainers.archer.core import ArcherConfig, ArcherTrainer
from turngym.trainers.archer.plugins import Plugin, plugin_names, register_plugin
from turngym.trainers.archer import tree, critic_rank, sibling_auc, awr, self_imitation, clone_wins  # noqa: F401,I001
from turngym.trainers.archer import expert_replay, expert_auc, probes, best_of_n, acting, hierarchy  # noqa: F401,I001
from turngym.trainers.registry import Algorithm, register_algorithm
from turngym.trainers.stages import Section, register_section



def _quickstart() -> ArcherConfig:
    # the paper's algorithm in a CPU's sizes on the quickstart's games: the reply cap from the env, loops cut short
    return ArcherConfig(max_new_tokens=0, max_state_visits=3)


register_section(Section("archer", ArcherConfig, _quickstart, "ArCHer (algo=archer)"))
register_algorithm(Algorithm("archer", section="archer", config=ArcherConfig, trainer=ArcherTrainer,
                             help="utterance-level critic, token-level actor (Zhou et al. 2024)"))

__all__ = ["ArcherConfig", "ArcherTrainer", "Plugin", "plugin_names", "register_plugin"]
