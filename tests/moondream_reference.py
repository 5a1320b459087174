"""An independent, eager, plain-torch reading of ../shared/moondream2.md: the checkpoint read by the
spec's tensor names, the overlap-crop tiling, the vision tower, the text decoder recomputed over the
whole sequence each step with the spec's mask (no KV cache, no engine parts), the region heads and
the skills' decoding loops (§7.3, §7.4). The engine is tested against it."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from safetensors.torch import load_file


def gelu(x):
    return F.gelu(x, approximate="tanh")


def linear(w, name, x):
    return x @ w[f"{name}.weight"].T + w[f"{name}.bias"]


def layer_norm(w, name, x):
    return F.layer_norm(x, x.shape[-1:], w[f"{name}.weight"], w[f"{name}.bias"], eps=1e-5)


def mlp(w, name, x):
    return linear(w, f"{name}.fc2", gelu(linear(w, f"{name}.fc1", x)))


class Moondream:
    def __init__(self, path: Path, dtype=torch.float32, device="cpu") -> None:
        self.w = {k: v.to(device=device, dtype=dtype) for k, v in load_file(str(path / "model.safetensors")).items()}
        self.device = device
        self.cfg = json.loads((path / "config.json").read_text()).get("config", {})
        text, vision = self.cfg.get("text", {}), self.cfg.get("vision", {})
        self.layers = text.get("n_layers", 24)
        self.heads = text.get("n_heads", 32)
        self.vision_layers = vision.get("enc_n_layers", 27)
        self.vision_heads = vision.get("enc_n_heads", 16)
        templates = self.cfg.get("tokenizer", {}).get("templates")
        self.templates = templates or {
            "caption": {"short": [1, 32708, 2, 12492, 3], "normal": [1, 32708, 2, 6382, 3],
                        "long": [1, 32708, 2, 4059, 3]},
            "query": {"prefix": [1, 15381, 2], "suffix": [3]}, "detect": {"prefix": [1, 7235, 476, 2], "suffix": [3]},
            "point": {"prefix": [1, 2581, 2], "suffix": [3]}}
        self.dtype = dtype

    # ---- §3: crops ------------------------------------------------------------------------
    @staticmethod
    def tiling(h: int, w: int, c: int = 266, most: int = 12) -> tuple[int, int]:
        if h <= c or w <= c:
            return 1, 1
        mh, mw = math.ceil(h / c), math.ceil(w / c)
        if mh * mw > most:
            r = math.sqrt(most / (mh * mw))
            return max(1, int(mh * r)), max(1, int(mw * r))
        ht, wt = max(int(math.sqrt(most * h / w)), mh), max(int(math.sqrt(most * w / h)), mw)
        if ht * wt > most:
            if wt > ht:
                wt = most // ht
            else:
                ht = most // wt
        return max(1, ht), max(1, wt)

    def crops(self, image: Image.Image) -> tuple[torch.Tensor, tuple[int, int]]:
        image = image.convert("RGB")
        w, h = image.size
        th, tw = self.tiling(h - 112, w - 112)
        x = torch.from_numpy(pil_crops(image, (th, tw))).to(torch.bfloat16)
        return ((x / 255 - 0.5) / 0.5).to(device=self.device, dtype=self.dtype), (th, tw)

    # ---- §1.1, §3.7-3.10: vision --------------------------------------------------------------
    def image_embeddings(self, image: Image.Image) -> torch.Tensor:
        w = self.w
        x, (th, tw) = self.crops(image)
        n = x.shape[0]
        patches = x.reshape(n, 3, 27, 14, 27, 14).permute(0, 2, 4, 1, 3, 5).reshape(n, 729, 588)
        x = linear(w, "model.vision.patch_emb", patches) + w["model.vision.pos_emb"]
        for i in range(self.vision_layers):
            b = f"model.vision.blocks.{i}"
            h = layer_norm(w, f"{b}.ln1", x)
            d = x.shape[-1]
            q, k, v = linear(w, f"{b}.attn.qkv", h).split(d, dim=-1)
            q, k, v = (t.view(n, 729, self.vision_heads, -1).transpose(1, 2) for t in (q, k, v))
            a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1) @ v
            x = x + linear(w, f"{b}.attn.proj", a.transpose(1, 2).reshape(n, 729, d))
            x = x + mlp(w, f"{b}.mlp", layer_norm(w, f"{b}.ln2", x))
        x = layer_norm(w, "model.vision.post_ln", x)
        e = x.shape[-1]
        local = x[1:].view(th, tw, 27, 27, e)
        grid = x.new_zeros(19 * th + 8, 19 * tw + 8, e)
        for i in range(th):
            for j in range(tw):
                r0, r1 = (0 if i == 0 else 4), (27 if i == th - 1 else 23)
                c0, c1 = (0 if j == 0 else 4), (27 if j == tw - 1 else 23)
                grid[19 * i + r0:19 * i + r1, 19 * j + c0:19 * j + c1] = local[i, j, r0:r1, c0:c1]
        pooled = x.new_zeros(27, 27, e)  # adaptive average pooling, windows written out
        gh, gw = grid.shape[:2]
        for oy in range(27):
            for ox in range(27):
                y0, y1 = (oy * gh) // 27, -(-((oy + 1) * gh) // 27)
                x0, x1 = (ox * gw) // 27, -(-((ox + 1) * gw) // 27)
                pooled[oy, ox] = grid[y0:y1, x0:x1].mean(dim=(0, 1))
        feats = torch.cat([x[0], pooled.reshape(729, e)], dim=-1)
        return mlp(w, "model.vision.proj_mlp", feats)

    # ---- §4, §5: the text decoder over a whole sequence of embeddings -------------------------
    def text(self, x: torch.Tensor, prefix: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Input embeddings [T, dim] -> (logits of the last position, hidden states before post_ln [T, dim])."""
        w, t = self.w, x.shape[0]
        pos = torch.arange(t, device=x.device)
        i, j = pos[:, None], pos[None, :]
        allowed = (j <= i) | ((i < prefix) & (j < prefix))
        inv = 1.0 / (10000 ** (torch.arange(0, 32, 2, device=x.device).float() / 32))
        ang = pos.float()[:, None] * inv[None, :]
        cos, sin = ang.cos().to(self.dtype), ang.sin().to(self.dtype)

        def rope(q):  # q [heads, T, 64]: pairs (j, 16 + j) of the first 32 dims rotate
            a, b, rest = q[..., :16], q[..., 16:32], q[..., 32:]
            return torch.cat([a * cos - b * sin, a * sin + b * cos, rest], dim=-1)

        for n in range(self.layers):
            b = f"model.text.blocks.{n}"
            h = layer_norm(w, f"{b}.ln", x)
            q, k, v = linear(w, f"{b}.attn.qkv", h).split(x.shape[-1], dim=-1)
            q, k, v = (z.view(t, self.heads, 64).transpose(0, 1) for z in (q, k, v))
            q, k = rope(q), rope(k)
            s = (q @ k.transpose(-1, -2) / 8).masked_fill(~allowed, float("-inf"))
            a = (torch.softmax(s, dim=-1) @ v).transpose(0, 1).reshape(t, -1)
            x = x + linear(w, f"{b}.attn.proj", a) + mlp(w, f"{b}.mlp", h)
        logits = linear(w, "model.text.lm_head", layer_norm(w, "model.text.post_ln", x[-1]))
        return logits, x

    # ---- §6: region -------------------------------------------------------------------------
    def encode_coord(self, c: float) -> torch.Tensor:
        c = torch.tensor([[c]], dtype=self.dtype, device=self.device)
        f = 2 * math.pi * c @ self.w["model.region.coord_features"]
        return linear(self.w, "model.region.coord_encoder", torch.cat([f.cos(), f.sin()], dim=-1))[0]

    def encode_size(self, wh: tuple[float, float]) -> torch.Tensor:
        wh = torch.tensor([wh], dtype=torch.float32, device=self.device).to(self.dtype)
        f = 2 * math.pi * wh @ self.w["model.region.size_features"]
        return linear(self.w, "model.region.size_encoder", torch.cat([f.cos(), f.sin()], dim=-1))[0]

    def decode_coord(self, hidden: torch.Tensor) -> float:
        return int(mlp(self.w, "model.region.coord_decoder", hidden).argmax()) / 1024

    def decode_size(self, hidden: torch.Tensor) -> tuple[float, float]:
        bins = mlp(self.w, "model.region.size_decoder", hidden).view(2, 1024).argmax(dim=-1).float()
        w, h = (2 ** (10 * bins / 1023 - 10)).tolist()
        return w, h

    # ---- §7: skills ---------------------------------------------------------------------------
    def _prefix(self, image: Image.Image, prompt: list[int]) -> torch.Tensor:
        wte = self.w["model.text.wte"]
        return torch.cat([wte[0][None], self.image_embeddings(image), wte[prompt]])

    def answer(self, image: Image.Image, prompt: list[int], max_tokens: int) -> list[int]:
        """Greedy caption / query: the first token unmasked, then the answer id banned; ends at EOS."""
        wte = self.w["model.text.wte"]
        x = self._prefix(image, prompt)
        logits, _ = self.text(x, 730)
        out = []
        tok = int(logits.argmax())
        while tok != 0 and len(out) < max_tokens:
            out.append(tok)
            x = torch.cat([x, wte[tok][None]])
            logits, _ = self.text(x, 730)
            logits[3] = float("-inf")
            tok = int(logits.argmax())
        return out

    def caption(self, image, length, max_tokens):
        return self.answer(image, self.templates["caption"][length], max_tokens)

    def query(self, image, question_ids, max_tokens):
        t = self.templates["query"]
        return self.answer(image, t["prefix"] + question_ids + t["suffix"] + t["suffix"], max_tokens)

    def objects(self, image: Image.Image, object_ids: list[int], detect: bool, max_objects: int) -> list[dict]:
        t = self.templates["detect" if detect else "point"]
        x = self._prefix(image, t["prefix"] + object_ids + t["suffix"])

        def step(emb):
            nonlocal x
            x = torch.cat([x, emb[None].to(self.dtype)])
            return self.text(x, 730)

        logits, hidden = self.text(x, 730)
        h, tok, out = hidden[-1], int(logits.argmax()), []
        while tok != 0 and len(out) < max_objects:
            cx = self.decode_coord(h)
            _, hidden = step(self.encode_coord(cx))
            cy = self.decode_coord(hidden[-1])
            if detect:
                _, hidden = step(self.encode_coord(cy))
                w, hh = self.decode_size(hidden[-1])
                out.append({"x_min": cx - w / 2, "y_min": cy - hh / 2, "x_max": cx + w / 2, "y_max": cy + hh / 2})
                emb = self.encode_size((w, hh))
            else:
                out.append({"x": cx, "y": cy})
                emb = self.encode_coord(cy)
            logits, hidden = step(emb)
            h, tok = hidden[-1], int(logits.argmax())
        return out


def pil_crops(image: Image.Image, tiling: tuple[int, int]) -> np.ndarray:
    """§3.3-3.5 with Pillow's Lanczos: uint8 [1 + th*tw, 3, 378, 378], the global crop first."""
    th, tw = tiling
    out = [np.asarray(image.resize((378, 378), Image.LANCZOS))]
    big = np.asarray(image.resize((tw * 266 + 112, th * 266 + 112), Image.LANCZOS))
    out += [big[266 * i:266 * i + 378, 266 * j:266 * j + 378] for i in range(th) for j in range(tw)]
    return np.stack(out).transpose(0, 3, 1, 2)
