"""`fusedspec keygen DIR`: an Ed25519 key pair for signing manifests (DIR/signing-key.pem, mode 0600) and
verifying them (DIR/verify-key.pem). Point FUSEDSPEC_SIGNING_KEY_FILE at the first where versions are
published, and FUSEDSPEC_VERIFY_KEY_FILE (or FUSEDSPEC_VERIFY_KEY) at the second where they are read.
The private key is never printed. Refuses to overwrite existing keys.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from fusedspec.core.errors import ConfigError
from fusedspec.core.settings import Settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir", metavar="DIR", type=Path,
                        help="where to write signing-key.pem and verify-key.pem")
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")


def run(args: argparse.Namespace, settings: Settings) -> int:
    from fusedspec.registry.signing import generate_keys, key_id, load_verify_key

    private_path, public_path = args.dir / "signing-key.pem", args.dir / "verify-key.pem"
    existing = [str(p) for p in (private_path, public_path) if p.exists()]
    if existing:
        raise ConfigError(f"{', '.join(existing)} already exist(s); choose another directory (keys are never "
                          "overwritten: versions signed with them would no longer verify)")
    try:
        args.dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a file in the way, no permission: the user's to fix, not a crash
        raise ConfigError(f"{args.dir}: cannot be made a directory "
                          f"({exc.strerror}); choose another directory") from None
    private_pem, public_pem = generate_keys()
    descriptor = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(private_pem)
    public_path.write_text(public_pem)
    ident = key_id(load_verify_key(public_pem))
    if args.json:
        print(json.dumps({"ok": True, "signing_key": str(private_path), "verify_key": str(public_path),
                          "key_id": ident}, indent=2))
    else:
        print(f"key {ident}: signing key {private_path} (keep it secret), verify key {public_path}")
    return 0
