"""A file in parts of at most M MiB, with a SHA-256 manifest, and back (the GGUF file moved in
pieces; data/reference/README.md says how).

    python scripts/split_file.py split FILE [--out DIR] [--parts N] [--max-mib M]   # DIR/<name>.part-i-of-N, <name>.parts.json
    python scripts/split_file.py join MANIFEST [--out FILE]                         # checks every part and the whole

Join refuses a missing part, a part whose size or SHA-256 differs from the manifest, or a joined file whose SHA-256
differs, with an error naming it (exit status 1), and leaves nothing at the output then.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specdec_core.tools.gpu_reference import join_parts, split_file


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    sp = sub.add_parser("split", help="FILE → parts of at most --max-mib MiB and a manifest")
    sp.add_argument("file")
    sp.add_argument("--out", help="folder for the parts and the manifest (default: the file's folder)")
    sp.add_argument("--parts", type=int, help="how many parts (default: as few as fit --max-mib)")
    sp.add_argument("--max-mib", type=float, default=24.0, help="the largest part, in MiB (default 24)")
    jp = sub.add_parser("join", help="a manifest's parts → the file, checked")
    jp.add_argument("manifest")
    jp.add_argument("--out", help="the joined file (default: beside the manifest, under the file's name)")
    args = ap.parse_args(argv)
    try:
        if args.command == "split":
            manifest = split_file(args.file, args.out or Path(args.file).parent, args.parts, args.max_mib)
            print(manifest)
        else:
            print(join_parts(args.manifest, args.out))
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
