"""What the corpus scripts (fuzz/make_corpus*.py) share."""
import pathlib


def clear_hand_made(d: pathlib.Path) -> None:
    """Empties corpus directory d of the seeds the scripts write. Kept: crash* (inputs that once crashed a target,
    committed when fixed) and cov-* (what open-ended fuzzing found that reaches code these seeds do not)."""
    d.mkdir(parents=True, exist_ok=True)
    for f in d.iterdir():
        if not f.name.startswith(("cov-", "crash")):
            f.unlink()
