"""Chess and Endgames against Stockfish: move parsing, error observations, the legal-move listing,
determinism, the endgame splits and the oracle. Tests that play need the `stockfish` binary and
skip with the reason without it; engine depths are kept low so each game step is milliseconds."""

import pytest

chess = pytest.importorskip("chess")

import turngym  # noqa: E402
from turngym.envs.games.chessgame import (  # noqa: E402
    ChessEnv,
    EngineNotFound,
    find_engine,
    openings,
    parse_move,
    render_board,
)
from turngym.envs.games.endgames import (  # noqa: E402
    MOVE_LIMITS,
    canonical_key,
    endgame_tasks,
    generate,
)
from turngym.envs.splits import split_of  # noqa: E402

try:
    find_engine()
    NO_ENGINE = ""
except EngineNotFound as e:
    NO_ENGINE = str(e)
needs_engine = pytest.mark.skipif(bool(NO_ENGINE), reason=f"no chess engine: {NO_ENGINE}")


# ----- pure parts (no engine) ---------------------------------------------------------------------
def test_parse_move_accepts_san_and_uci():
    b = chess.Board()
    assert parse_move(b, "Nf3") == parse_move(b, "g1f3") == chess.Move.from_uci("g1f3")
    assert parse_move(b, " 1. e4!? ") == chess.Move.from_uci("e2e4")
    b = chess.Board("r3k2r/8/8/8/8/8/8/R3K2R w KQkq - 0 1")
    assert parse_move(b, "0-0") == parse_move(b, "O-O") == parse_move(b, "e1g1") == chess.Move.from_uci("e1g1")
    b = chess.Board("8/4P3/8/8/8/8/k7/4K3 w - - 0 1")
    assert parse_move(b, "e8=Q") == parse_move(b, "e7e8q") == chess.Move.from_uci("e7e8q")


def test_parse_move_errors_say_why():
    b = chess.Board()
    with pytest.raises(ValueError, match="not a legal move for White"):
        parse_move(b, "Ke2")
    with pytest.raises(ValueError, match="not a legal move"):
        parse_move(b, "e2e5")
    with pytest.raises(ValueError, match="not a legal move"):
        parse_move(b, "hello")
    with pytest.raises(ValueError, match="empty"):
        parse_move(b, "  ")
    two_knights = chess.Board("4k3/8/8/8/8/8/8/1N2KN2 w - - 0 1")  # Nb1 and Nf1 both reach d2
    with pytest.raises(ValueError, match="ambiguous"):
        parse_move(two_knights, "Nd2")


def test_render_board_start_position():
    lines = render_board(chess.Board()).splitlines()
    assert lines[0] == "8 r n b q k b n r"
    assert lines[6] == "2 P P P P P P P P"
    assert lines[4] == "4 . . . . . . . ."
    assert lines[8] == "  a b c d e f g h"


def test_missing_engine_says_how_to_install():
    with pytest.raises(EngineNotFound, match="apt-get install stockfish"):
        ChessEnv(engine_path="/nonexistent/stockfish")
    assert issubclass(EngineNotFound, ImportError)  # the bench skips such an entry, naming the fix


def test_chess_tasks_cover_every_opening_once():
    assert len(openings()) == 400 and len(set(openings())) == 400
    keys = {split: {f"{w}{b}:{c}" for (w, b) in openings() for c in ("white", "black") if split_of(f"chess:{w}{b}:{c}") == split}
            for split in ("train", "test")}
    assert not keys["train"] & keys["test"] and len(keys["train"]) + len(keys["test"]) == 800


def test_canonical_key_is_symmetry_invariant():
    b = chess.Board("8/8/3k2K1/8/8/4Q3/8/8 w - - 0 1")
    for f in (chess.flip_vertical, chess.flip_horizontal, chess.flip_diagonal, chess.flip_anti_diagonal):
        assert canonical_key(b.transform(f)) == canonical_key(b)
    assert canonical_key(b.mirror()) == canonical_key(b)  # colours swapped, Black to move
    assert canonical_key(chess.Board("8/8/3k3K/8/8/4Q3/8/8 w - - 0 1")) != canonical_key(b)


def test_endgames_are_seeded_valid_and_train_test_disjoint():
    assert generate("KRK", 7).fen() == generate("KRK", 7).fen()
    train, test = endgame_tasks("train", n_per_kind=60), endgame_tasks("test", n_per_kind=60)
    assert len(train) == len(test) == 180
    keys = {s: {canonical_key(chess.Board(fen)) for _, fen in tasks.values()} for s, tasks in (("train", train), ("test", test))}
    assert len(keys["train"]) == len(keys["test"]) == 180  # no duplicates (up to symmetry) within a split
    assert not keys["train"] & keys["test"]  # and none shared between the splits
    colours = set()
    for kind, fen in test.values():
        b = chess.Board(fen)
        strong = b.turn
        assert b.is_valid() and not b.is_game_over() and len(b.piece_map()) == len(kind)
        assert all(p.color == strong for sq, p in b.piece_map().items() if p.piece_type != chess.KING)
        if kind == "KBBK":
            bishops = list(b.pieces(chess.BISHOP, strong))
            assert (chess.square_file(bishops[0]) + chess.square_rank(bishops[0])) % 2 != (
                chess.square_file(bishops[1]) + chess.square_rank(bishops[1])) % 2
        colours.add(strong)
    assert colours == {chess.WHITE, chess.BLACK}


# ----- the envs (need Stockfish) ------------------------------------------------------------------
@pytest.fixture
def chess_env():
    env = turngym.make("turngym/Chess-v0", split="test", oracle_depth=2, scripted_hints=True)
    yield env
    env.close()


@needs_engine
def test_illegal_move_is_an_error_observation(chess_env):
    chess_env.reset(seed=0, options={"task_id": chess_env.unwrapped.task_ids[0]})
    fen = chess_env.unwrapped.board.fen()
    obs, reward, term, _trunc, info = chess_env.step("Qxh9")
    assert info["action_valid"] is False and reward == 0.0 and not term
    assert "not a legal move" in obs[0].content and 'Reply "legal"' in obs[0].content
    assert chess_env.unwrapped.board.fen() == fen  # the position did not change


@needs_engine
def test_legal_moves_are_listed_on_request(chess_env):
    chess_env.reset(seed=0, options={"task_id": chess_env.unwrapped.task_ids[0]})
    board = chess_env.unwrapped.board
    obs, reward, term, _, info = chess_env.step("legal")
    assert info["action_valid"] and not term and reward == 0.0
    listed = obs[0].content.split(": ", 1)[1].split(", ")
    assert len(listed) == board.legal_moves.count()
    assert {m.uci() for m in board.legal_moves} == {x.split("(")[1].rstrip(")") for x in listed}
    hermes = turngym.make("turngym/Chess-v0", split="test", tool_format="hermes")  # the legal_moves tool
    try:
        hermes.reset(seed=0, options={"task_id": hermes.unwrapped.task_ids[0]})
        obs, *_, info = hermes.step('<tool_call>{"name": "legal_moves", "arguments": {}}</tool_call>')
        assert info["action_valid"] and obs[0].content.count("(") == hermes.unwrapped.board.legal_moves.count()
    finally:
        hermes.close()


@needs_engine
def test_san_and_uci_play_the_same_move():
    envs = [turngym.make("turngym/Chess-v0", split="test") for _ in range(2)]
    try:
        task = envs[0].unwrapped.task_ids[1]
        for e in envs:
            e.reset(seed=0, options={"task_id": task})
        move = min(envs[0].unwrapped.board.legal_moves, key=chess.Move.uci)
        san = envs[0].unwrapped.board.san(move)
        outs = [envs[0].step(san), envs[1].step(move.uci())]
        assert all(o[4]["action_valid"] for o in outs)
        assert outs[0][0][0].content == outs[1][0][0].content
        assert f"You played {san}." in outs[0][0][0].content and "Stockfish played" in outs[0][0][0].content
    finally:
        for e in envs:
            e.close()


@needs_engine
@pytest.mark.parametrize("kwargs", [{}, {"blunder_prob": 0.5}])
def test_games_replay_exactly_under_a_task(kwargs):
    def play():
        env = turngym.make("turngym/Chess-v0", split="test", **kwargs)
        try:
            obs, info = env.reset(seed=5, options={"task_id": env.unwrapped.task_ids[3]})
            seen = [obs[-1].content]
            for _ in range(6):  # always the first legal move in UCI order: a fixed agent
                m = min(env.unwrapped.board.legal_moves, key=chess.Move.uci)
                obs, r, term, _, info = env.step(m.uci())
                seen.append((obs[0].content, r, info["state_key"]))
                if term:
                    break
            return seen
        finally:
            env.close()

    assert play() == play()


@needs_engine
def test_endgame_oracle_checkmates_within_the_limit():
    env = turngym.make("turngym/Endgames-v0", split="test", kinds=("KQK", "KRK"), n_per_kind=3, scripted_hints=True)
    try:
        for task in ("KQK-test-000", "KRK-test-001"):
            obs, info = env.reset(seed=0, options={"task_id": task})
            assert f"within {MOVE_LIMITS[task[:3]]}" in obs[0].content
            total, done, turns = 0.0, False, 0
            while not done:
                obs, r, done, trunc, info = env.step(info["oracle_action"])
                total, turns = total + r, turns + 1
                assert info["action_valid"] and not trunc
            assert info["result"] == "win" and total == 1.0 and env.unwrapped.outcome() == 1.0
            assert turns <= MOVE_LIMITS[task[:3]] and "Checkmate: you win" in obs[0].content
    finally:
        env.close()


@needs_engine
def test_endgame_move_limit_ends_the_episode():
    env = turngym.make("turngym/Endgames-v0", split="test", kinds=("KRK",), n_per_kind=2, move_limits={"KRK": 1})
    try:
        env.reset(seed=0, options={"task_id": "KRK-test-000"})
        b = env.unwrapped.board
        quiet = next(m for m in sorted(b.legal_moves, key=chess.Move.uci) if not b.gives_check(m))
        obs, r, term, _, info = env.step(quiet.uci())
        assert term and r == 0.0 and info["result"] == "limit" and "did not checkmate within 1" in obs[0].content
        obs, r, term, _, info = env.step("Kh1")  # the game is over: an error observation
        assert info["action_valid"] is False
    finally:
        env.close()


@needs_engine
def test_dense_rewards_telescope_to_result_minus_start():
    env = turngym.make("turngym/Endgames-v0", split="test", kinds=("KQK",), n_per_kind=2, dense_reward=1.0,
                       eval_depth=4, scripted_hints=True)
    try:
        _, info = env.reset(seed=0, options={"task_id": "KQK-test-000"})
        e_start = env.unwrapped._expect
        assert 0.5 < e_start <= 1.0  # a queen up
        total, done = 0.0, False
        while not done:
            _obs, r, done, _, info = env.step(info["oracle_action"])
            total += r
        # sparse 1.0 for the mate, plus dense terms that sum to 1.0 * (1.0 - E_start)
        assert total == pytest.approx(1.0 + (1.0 - e_start))
    finally:
        env.close()


@needs_engine
def test_a_draw_needs_the_position_three_times(chess_env):
    env = chess_env.unwrapped
    chess_env.reset(seed=0, options={"task_id": env.task_ids[0]})
    env.board = chess.Board("2K1k3/8/8/8/8/8/2Q5/8 w - - 0 1")
    for san in ["Qc7", "Kf8", "Qh7", "Ke8", "Qg8+", "Ke7", "Qg6", "Kf8", "Qh7", "Ke8", "Kc7", "Kf8"]:
        env.board.push_san(san)
    assert env.board.can_claim_threefold_repetition()  # Kc8 would repeat a position a third time...
    assert not env._check_over() and env._result is None  # ...but it has not happened: play on
    env.board = chess.Board()
    for san in ["Nf3", "Nf6", "Ng1", "Ng8", "Nf3", "Nf6", "Ng1", "Ng8"]:
        env.board.push_san(san)
    assert env._check_over() and env._result == "draw" and env.outcome() == 0.5
