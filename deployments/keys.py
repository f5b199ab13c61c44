"""`python -m deployments.keys new`: a fresh API key and the digest to put in the config.

`python -m deployments.keys digest <key>` prints the digest of an existing key.
"""

from __future__ import annotations

import argparse

from deployments.core.access.keys import digest, new_key


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m deployments.keys")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("new", help="make a key; print it and its SHA-256 digest")
    of = commands.add_parser("digest", help="print the SHA-256 digest of a key")
    of.add_argument("key")
    args = parser.parse_args(argv)
    if args.command == "new":
        key = new_key()
        print(f"key:        {key}    (give this to the client; it is not stored anywhere)")
        print(f"key_sha256: {digest(key)}    (put this under the tenant in serve_config.yaml)")
    else:
        print(digest(args.key))


if __name__ == "__main__":
    main()
