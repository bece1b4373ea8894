"""LMRL-Gym-style games: maze, text navigation, Wordle, Twenty Questions, Guess My City, chess,
chess endgames and Car Dealer.

Every game is seeded and has a scripted optimal (or near-optimal) player as its oracle. The
default tool format is ``text``: the whole reply is the move, word or question.
"""

from turngym.envs.registry import register

_G = "turngym.envs.games"

register("turngym/Maze-v0", entry_point=f"{_G}.maze:MazeEnv", kwargs={"observation": "full"}, max_turns=60,
         description="Grid maze, fully observed (map shown); 4x4 and 6x6 mazes")
register("turngym/Maze-partial-v0", entry_point=f"{_G}.maze:MazeEnv", kwargs={"observation": "partial"}, max_turns=60,
         description="Grid maze, partially observed (only the open directions here)")
register("turngym/TextNav-v0", entry_point=f"{_G}.textnav:TextNavEnv", max_turns=40,
         description="Text navigation: fetch an object and deliver it; some doors need a key")
register("turngym/Wordle-v0", entry_point=f"{_G}.wordle:WordleEnv", max_turns=10,
         description="Wordle with the built-in word list (words='lmrl' for the official lists)")
register("turngym/TwentyQuestions-v0", entry_point=f"{_G}.twenty_questions:TwentyQuestionsEnv", max_turns=25,
         description="Twenty Questions with a rule-based answerer over 84 objects")
register("turngym/GuessMyCity-v0", entry_point=f"{_G}.guess_city:GuessMyCityEnv", max_turns=25,
         description="Guess My City with a rule-based answerer over 40 cities")
# A language model answers (the `default` agent unless `answerer=` names another Policy or spec).
register("turngym/TwentyQuestions-llm-v0", entry_point=f"{_G}.twenty_questions:TwentyQuestionsEnv",
         kwargs={"answerer": "default"}, max_turns=25, nondeterministic=True,
         description="Twenty Questions answered by a language model (answerer=Policy or agent spec)")
register("turngym/GuessMyCity-llm-v0", entry_point=f"{_G}.guess_city:GuessMyCityEnv",
         kwargs={"answerer": "default"}, max_turns=25, nondeterministic=True,
         description="Guess My City answered by a language model (answerer=Policy or agent spec)")
# Chess and Endgames need the `stockfish` binary (apt-get install stockfish); see chessgame.py.
register("turngym/Chess-v0", entry_point=f"{_G}.chessgame:ChessEnv", max_turns=150,
         description="Chess against Stockfish (depth 1 by default); win 1, draw 0.5; SAN or UCI moves")
register("turngym/Endgames-v0", entry_point=f"{_G}.endgames:EndgamesEnv", max_turns=60,
         description="Chess endgames KQK, KRK, KBBK: checkmate Stockfish's lone king within N moves")
register("turngym/CarDealer-v0", entry_point=f"{_G}.car_dealer:CarDealerEnv", max_turns=12,
         description="Car Dealer: sell a car to a scripted buyer with a hidden budget; reward = price / budget")
register("turngym/CarDealer-llm-v0", entry_point=f"{_G}.car_dealer:CarDealerEnv",
         kwargs={"buyer": "default"}, max_turns=12, nondeterministic=True,
         description="Car Dealer with a language model speaking for the buyer (buyer=Policy or agent spec)")
