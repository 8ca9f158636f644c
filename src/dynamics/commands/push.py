"""``dynamics push RUN_DIR REPO_ID [--private] [--dry-run]``: upload a finished run's
``best_checkpoint/`` to a Hugging Face Hub model repository, with its model card.

The card (``best_checkpoint/README.md``, ``dynamics.runs.model_card``) is written when the
folder has none of its own (no README, PEFT's empty template, or a card dynamics wrote,
rewritten to name REPO_ID); a card written by hand is uploaded as it is. The token is the
usual one of ``huggingface_hub``: ``HF_TOKEN``, or the one ``hf auth login`` saved."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = "upload a run's best checkpoint, with its model card, to the Hugging Face Hub"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a finished run folder written by 'dynamics run'")
    parser.add_argument("repo_id", metavar="REPO_ID", help="the Hub model repository, e.g. my-org/my-model")
    parser.add_argument("--private", action="store_true", help="create the repository private")
    parser.add_argument(
        "--dry-run", action="store_true", help="write the model card and list the files, upload nothing"
    )


def upload_files(checkpoint: Path) -> list[str]:
    """The files of ``checkpoint`` that are uploaded, relative and sorted: every file but
    hidden ones (a temporary file of an unfinished write)."""
    return sorted(
        path.relative_to(checkpoint).as_posix()
        for path in checkpoint.rglob("*")
        if path.is_file() and not any(part.startswith(".") for part in path.relative_to(checkpoint).parts)
    )


def main(args: argparse.Namespace) -> int:
    from dynamics.commands.errors import UsageError
    from dynamics.runs.model_card import CARD_FILE, card_is_missing, write_model_card
    from dynamics.runs.rundir import RunDirError, best_checkpoint_dir, read_run

    folder = Path(args.run_dir)
    checkpoint = best_checkpoint_dir(folder)
    try:
        from huggingface_hub.errors import HFValidationError
        from huggingface_hub.utils import validate_repo_id

        validate_repo_id(args.repo_id)
    except HFValidationError as err:
        raise UsageError(f"REPO_ID {args.repo_id!r} is not a Hub repository id ({err}); use e.g. my-org/my-model") from None
    try:
        summary = read_run(folder).summary
        card = checkpoint / CARD_FILE
        if card_is_missing(card):
            write_model_card(folder, repo_id=args.repo_id)
            card_note = "written"
        else:
            card_note = "kept: written by hand"
    except RunDirError as err:
        raise UsageError(str(err)) from None
    files = upload_files(checkpoint)
    visibility = "private" if args.private else "public"
    step = summary["best_checkpoint"]["step"]
    print(f"model card: {card} ({card_note})")
    if args.dry_run:
        print(f"dry run: would upload {len(files)} files of {checkpoint} (step {step}) to {args.repo_id} ({visibility}):")
        for name in files:
            print(f"  {name}")
        return 0

    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, LocalTokenNotFoundError

    api = HfApi()
    try:
        url = api.create_repo(args.repo_id, private=args.private, exist_ok=True, repo_type="model")
        api.upload_folder(
            repo_id=args.repo_id,
            folder_path=checkpoint,
            repo_type="model",
            allow_patterns=files,
            commit_message=f"dynamics: best checkpoint of {folder.name} (step {step})",
        )
    except LocalTokenNotFoundError:
        raise UsageError(
            "no Hugging Face token: log in with 'hf auth login' or set HF_TOKEN (a token with write access)"
        ) from None
    except HfHubHTTPError as err:
        status = getattr(getattr(err, "response", None), "status_code", None)
        if status in (401, 403):
            raise UsageError(
                f"the Hub refused the upload to {args.repo_id} ({status}): log in with 'hf auth login' or set "
                "HF_TOKEN to a token with write access to that namespace"
            ) from None
        print(f"dynamics push: error: the upload to {args.repo_id} failed: {' '.join(str(err).split())}", file=sys.stderr)
        return 1
    print(f"uploaded {len(files)} files of {checkpoint} (step {step}) to {url} ({visibility})")
    return 0
