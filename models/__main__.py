"""`python -m models OUTDIR`: write every zoo model as OUTDIR/<name>.onnx."""
import argparse
from pathlib import Path

import onnx

from models.zoo import ZOO


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m models", description=__doc__)
    parser.add_argument("outdir", type=Path, help="folder to write the .onnx files into")
    outdir = parser.parse_args().outdir
    outdir.mkdir(parents=True, exist_ok=True)
    for name, builder in ZOO.items():
        model = builder()
        path = outdir / f"{name}.onnx"
        onnx.save(model, path)
        print(f"{path}  {len(model.graph.node)} nodes  {path.stat().st_size / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
