"""``dynamics push RUN_DIR REPO_ID [--private] [--merge [--base MODEL]] [--dry-run]``: upload a
finished run's ``best_checkpoint/`` to a Hugging Face Hub model repository, with its model card.

The card (``best_checkpoint/README.md``, ``dynamics.runs.model_card``) is written when the
folder has none of its own (no README, PEFT's empty template, or a card dynamics wrote,
rewritten to name REPO_ID); a card written by hand is uploaded as it is. The token is the
usual one of ``huggingface_hub``: ``HF_TOKEN``, or the one ``hf auth login`` saved.

``--private`` creates the repository private, or turns an existing public one private
before anything is uploaded (``create_repo(exist_ok=True)`` keeps an existing repository's
visibility); the visibility printed is the one the Hub reports.

``--merge`` uploads, instead of a LoRA/QLoRA run's adapter, the adapter merged into its
base model (``dynamics.engine.merge``), saved with the tokenizer and its own card into a
temporary folder; a full fine-tuning run's checkpoint is whole weights already, and push
says so and uploads nothing."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from huggingface_hub import HfApi

HELP = "upload a run's best checkpoint, with its model card, to the Hugging Face Hub"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run_dir", metavar="RUN_DIR", help="a finished run folder written by 'dynamics run'"
    )
    parser.add_argument(
        "repo_id", metavar="REPO_ID", help="the Hub model repository, e.g. my-org/my-model"
    )
    parser.add_argument(
        "--private",
        action="store_true",
        help="make the repository private (created private, or an existing public one turned "
        "private)",
    )
    parser.add_argument(
        "--merge",
        action="store_true",
        help="upload the LoRA/QLoRA adapter merged into its base model (whole weights) "
        "instead of the adapter",
    )
    parser.add_argument(
        "--base",
        metavar="MODEL",
        help="with --merge: the base model's hub id or folder, when the run config names none (as "
        "dynamics eval)",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="write the model card and list the files, upload nothing",
    )


def upload_files(checkpoint: Path) -> list[str]:
    """The files of ``checkpoint`` that are uploaded, relative and sorted: every file but
    hidden ones (a temporary file of an unfinished write)."""
    return sorted(
        path.relative_to(checkpoint).as_posix()
        for path in checkpoint.rglob("*")
        if path.is_file()
        and not any(part.startswith(".") for part in path.relative_to(checkpoint).parts)
    )


def main(args: argparse.Namespace) -> int:
    from dynamics.commands.errors import UsageError
    from dynamics.runs.rundir import RunDirError, read_run

    folder = Path(args.run_dir)
    try:
        from huggingface_hub.errors import HFValidationError
        from huggingface_hub.utils import validate_repo_id

        validate_repo_id(args.repo_id)
    except HFValidationError as err:
        raise UsageError(
            f"REPO_ID {args.repo_id!r} is not a Hub repository id ({err}); use e.g. my-org/my-model"
        ) from None
    if args.base is not None and not args.merge:
        raise UsageError(
            "--base names the base model to merge the adapter into: give it with --merge"
        )
    try:
        summary = read_run(folder).summary
    except RunDirError as err:
        raise UsageError(str(err)) from None
    if not args.merge:
        checkpoint = _checkpoint_with_card(folder, args.repo_id)
        return _push(args, folder, checkpoint, summary["best_checkpoint"]["step"])
    with tempfile.TemporaryDirectory(prefix="dynamics-merged-") as out:
        merged = _merged_with_card(folder, args.repo_id, Path(out), args.base)
        return _push(args, folder, merged, summary["best_checkpoint"]["step"])


def _checkpoint_with_card(folder: Path, repo_id: str) -> Path:
    """``best_checkpoint/``, its card written unless one was written by hand."""
    from dynamics.commands.errors import UsageError
    from dynamics.runs.model_card import CARD_FILE, card_is_missing, write_model_card
    from dynamics.runs.rundir import RunDirError, best_checkpoint_dir

    checkpoint = best_checkpoint_dir(folder)
    card = checkpoint / CARD_FILE
    try:
        if card_is_missing(card):
            write_model_card(folder, repo_id=repo_id)
            print(f"model card: {card} (written)")
        else:
            print(f"model card: {card} (kept: written by hand)")
    except RunDirError as err:
        raise UsageError(str(err)) from None
    return checkpoint


def _merged_with_card(folder: Path, repo_id: str, out: Path, base: str | None) -> Path:
    """The adapter merged into its base model in ``out``, with a card of the merged weights."""
    from dynamics.commands.errors import UsageError
    from dynamics.engine.merge import MergeError, merge_adapter
    from dynamics.runs.model_card import write_model_card
    from dynamics.runs.rundir import CHECKPOINT_DIR, RunDirError

    try:
        merge_adapter(folder, out, base)
        write_model_card(folder, repo_id=repo_id, weights_folder=out)
    except (MergeError, RunDirError) as err:
        raise UsageError(str(err)) from None
    print(
        f"merged: {folder / CHECKPOINT_DIR} into its base model, with a model card of the merged "
        "weights"
    )
    return out


def _push(args: argparse.Namespace, folder: Path, weights: Path, step: int) -> int:
    """Upload the files of ``weights`` to REPO_ID (or list them, ``--dry-run``)."""
    from dynamics.commands.errors import UsageError

    files = upload_files(weights)
    what = f"{len(files)} files of {weights} (step {step}{', merged' if args.merge else ''})"
    if args.dry_run:
        visibility = "private" if args.private else "the Hub's visibility for a new repository"
        print(f"dry run: would upload {what} to {args.repo_id} ({visibility}):")
        for name in files:
            print(f"  {name}")
        return 0

    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, LocalTokenNotFoundError

    api = HfApi()
    try:
        # None leaves a new repository's visibility to the Hub (an organisation may default to
        # private).
        url = api.create_repo(
            args.repo_id, private=True if args.private else None, exist_ok=True, repo_type="model"
        )
        visibility = (
            "private" if _is_private(api, args.repo_id, make_private=args.private) else "public"
        )
        api.upload_folder(
            repo_id=args.repo_id,
            folder_path=weights,
            repo_type="model",
            allow_patterns=files,
            commit_message=f"dynamics: best checkpoint of {folder.name} (step "
            f"{step}{', merged' if args.merge else ''})",
        )
    except LocalTokenNotFoundError:
        raise UsageError(
            "no Hugging Face token: log in with 'hf auth login' or set HF_TOKEN (a token with "
            "write access)"
        ) from None
    except HfHubHTTPError as err:
        status = getattr(getattr(err, "response", None), "status_code", None)
        if status in (401, 403):
            raise UsageError(
                f"the Hub refused the upload to {args.repo_id} ({status}): log in with 'hf auth "
                "login' or set HF_TOKEN to a token with write access to that namespace"
            ) from None
        print(
            f"dynamics push: error: the upload to {args.repo_id} failed: "
            f"{' '.join(str(err).split())}",
            file=sys.stderr,
        )
        return 1
    print(f"uploaded {what} to {url} ({visibility})")
    return 0


def _is_private(api: HfApi, repo_id: str, *, make_private: bool) -> bool:
    """Whether the Hub repository ``repo_id`` is private, after turning it private when
    ``make_private`` asks for it. ``create_repo(exist_ok=True)`` leaves an existing
    repository's visibility as it is, so a public one is changed with
    ``update_repo_settings``; when it stays public this refuses, before anything is uploaded."""
    from huggingface_hub.errors import HfHubHTTPError

    from dynamics.commands.errors import UsageError

    private = bool(api.repo_info(repo_id, repo_type="model").private)
    if private or not make_private:
        return private
    fix = "make it private in its settings on the Hub, or push to a new REPO_ID"
    try:
        api.update_repo_settings(repo_id, private=True, repo_type="model")
    except HfHubHTTPError as err:
        status = getattr(getattr(err, "response", None), "status_code", None)
        raise UsageError(
            f"--private: {repo_id} exists and is public, and the Hub refused to make it private "
            f"({status}): {fix}"
        ) from None
    if not api.repo_info(repo_id, repo_type="model").private:
        raise UsageError(
            f"--private: {repo_id} exists and is still public after the request to make it "
            f"private: {fix}"
        )
    return True
