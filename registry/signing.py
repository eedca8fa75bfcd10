"""Provenance of published versions: manifests signed with Ed25519 (the `cryptography` package).

    signing key   FUSEDSPEC_SIGNING_KEY or FUSEDSPEC_SIGNING_KEY_FILE (a Kubernetes secret mounted as a
                  file): PEM (PKCS#8) or the base64 of the raw 32-byte seed. Never printed, never logged.
    verify key    FUSEDSPEC_VERIFY_KEY or FUSEDSPEC_VERIFY_KEY_FILE: PEM (SubjectPublicKeyInfo) or the
                  base64 of the raw 32-byte public key. Public; `fusedspec k8s` puts it in the pod.

A signature covers the manifest's canonical encoding without the signature field; the manifest names its
signer by `key_id` (the first 16 hex of the sha256 of the raw public key). With a verify key configured,
a reader refuses unsigned manifests and manifests signed by another key; without one it reports the
signer and trusts the store as before.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Callable
from typing import TypeVar, cast

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from fusedspec.compile.documents.manifest import Manifest, Signature
from fusedspec.core.errors import ConfigError

Key = TypeVar("Key", Ed25519PrivateKey, Ed25519PublicKey)


def _raw_public(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_id(key: Ed25519PublicKey) -> str:
    return hashlib.sha256(_raw_public(key)).hexdigest()[:16]


def load_signing_key(text: str) -> Ed25519PrivateKey:
    """The private key in `text` (PEM or base64 seed); ConfigError that never quotes the key."""
    return _load_key(text, lambda pem: serialization.load_pem_private_key(pem, password=None),
                     Ed25519PrivateKey.from_private_bytes,
                     "FUSEDSPEC_SIGNING_KEY is not an Ed25519 private key (PEM, or the base64 of a 32-byte "
                     "seed); make one with `fusedspec keygen DIR`")


def load_verify_key(text: str) -> Ed25519PublicKey:
    return _load_key(text, serialization.load_pem_public_key, Ed25519PublicKey.from_public_bytes,
                     "FUSEDSPEC_VERIFY_KEY is not an Ed25519 public key (PEM, or the base64 of 32 bytes); "
                     "`fusedspec keygen DIR` writes one beside its private key")


def _load_key(text: str, from_pem: Callable[[bytes], object], from_raw: Callable[[bytes], Key],
              refusal: str) -> Key:
    text = text.strip()
    try:
        if not text.startswith("-----BEGIN"):
            return from_raw(base64.b64decode(text, validate=True))
        key = from_pem(text.encode())
        if not isinstance(key, Ed25519PrivateKey | Ed25519PublicKey):
            raise ValueError("not an Ed25519 key")  # an RSA or EC key in PEM
        return cast(Key, key)  # private or public as `from_pem` loads them: the kind asked for
    except (ValueError, TypeError, binascii.Error):
        raise ConfigError(refusal) from None


def sign(manifest: Manifest, private_key: Ed25519PrivateKey) -> Manifest:
    value = private_key.sign(manifest.unsigned_bytes())
    signature = Signature(key_id=key_id(private_key.public_key()), value=base64.b64encode(value).decode())
    return manifest.model_copy(update={"signature": signature})


def signature_problem(manifest: Manifest, public_key: Ed25519PublicKey | None) -> str | None:
    """Why `manifest` is not trusted under `public_key` (None: no key configured, nothing to check)."""
    if public_key is None:
        return None
    expected = key_id(public_key)
    if manifest.signature is None:
        return (f"the manifest is unsigned, and a verify key ({expected}) is configured: publish it again "
                "signed")
    if manifest.signature.key_id != expected:
        return (f"the manifest is signed by key {manifest.signature.key_id}, not by the configured verify "
                f"key {expected}: it was published by someone else (or before a key rotation: publish its "
                "artifact again with the signing key to sign it with this one)")
    try:
        public_key.verify(base64.b64decode(manifest.signature.value), manifest.unsigned_bytes())
    except (InvalidSignature, binascii.Error):
        return f"the manifest's signature by key {expected} does not match its content: it was altered"
    return None


def generate_keys() -> tuple[str, str]:
    """A new key pair as (private PEM, public PEM)."""
    private = Ed25519PrivateKey.generate()
    private_pem = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                        serialization.NoEncryption()).decode()
    public_pem = private.public_key().public_bytes(serialization.Encoding.PEM,
                                                   serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    return private_pem, public_pem
