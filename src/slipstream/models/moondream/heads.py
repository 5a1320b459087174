"""Moondream 2's work on the device beside the text decoder: the image prefix (vision encoder, then
BOS + 729 image embeddings prefilled with bidirectional attention into a sequence's KV pages), and
the skills' per-step rules, applied to a step's rows by their skill code (`Skill` in skills.py):

- caption / query rows: the answer id is banned after the first token (spec §7.3);
- point / detect rows: a device-side copy of the §7.4 state machine. In state X the full-vocabulary
  argmax decides (EOS ends, anything else is "one more object", reported as the coord id); Y is a
  forced coord, S a forced size. The value is decoded from the step's hidden state (before the final
  norm), and its encoding becomes the row's next input: the row's entry `vocab + row` of the
  extended embedding table, which the last-token table then points at, so the next forward (a
  captured graph or not) reads it like any token. Nothing waits for the host; the host follows
  the same machine at commit with the tokens and bins it reads back (skills.SpatialSkill)."""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ...kernels.attention import AttentionInputs
from ..phi import PhiForCausalLM
from .config import PREFIX_LEN, MoondreamConfig
from .region import RegionModel
from .skills import STATE_S, STATE_X, STATE_Y, Skill
from .vision import VisionEncoder


class MoondreamHeads(nn.Module):
    def __init__(self, cfg: MoondreamConfig, text: PhiForCausalLM, parts: dict[str, dict[str, torch.Tensor]],
                 max_rows: int, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.cfg = cfg
        with torch.device("meta"):
            self.vision, self.region = VisionEncoder(cfg.vision), RegionModel(cfg.region)
        for name, module in (("vision", self.vision), ("region", self.region)):
            module.load_state_dict({k: v.to(device=device, dtype=dtype) for k, v in parts[name].items()},
                                   assign=True)
        self.requires_grad_(False)
        self.text = text
        self.vocab = cfg.text.vocab_size
        tok = cfg.tokenizer
        self.bos, self.eos, self.answer, self.coord, self.size = (tok.bos_id, tok.eos_id, tok.answer_id, tok.coord_id,
                                                                  tok.size_id)
        # the embedding table grows a row per sequence row (and the scratch row): its next spatial input
        wte = text.model.embed_tokens.weight
        text.model.embed_tokens.weight = nn.Parameter(
            torch.cat([wte, wte.new_zeros(max_rows + 1, wte.shape[1])]), requires_grad=False)
        self.spatial_state = torch.zeros(max_rows + 1, dtype=torch.int64, device=device)

    # ---- the image prefix -----------------------------------------------------------------
    def prefill_images(self, crops: torch.Tensor, tilings: list[tuple[int, int]], slot_mapping: torch.Tensor,
                       kv, lora=None) -> None:
        """Encode the crops of several images (one encoder forward) and prefill each image's prefix
        (BOS + its 729 embeddings, positions 0..729, every position attending to all of them) into
        the KV slots `slot_mapping` [images * 730]; `lora` (LoraRows): each position's adapter."""
        images = self.vision(crops, tilings)
        n, dim = len(tilings), images.shape[-1]
        bos = self.text.model.embed_tokens.weight[self.bos].expand(n, 1, dim)
        x = torch.cat([bos, images.to(bos.dtype)], dim=1).reshape(n * PREFIX_LEN, dim)
        positions = torch.arange(PREFIX_LEN, device=x.device).repeat(n)
        rope = self.text.rotary.table(positions, x.dtype)
        attn = AttentionInputs(slot_mapping, None, None, block_len=PREFIX_LEN)
        for i, layer in enumerate(self.text.model.layers):
            x = layer(x, rope, attn, kv.layer(i), None if lora is None else lora.layer(i))

    # ---- the skills' rules around sampling -------------------------------------------------
    def ban_answer(self, logits: torch.Tensor, skill: torch.Tensor, token_index: torch.Tensor) -> None:
        """Caption and query rows may not sample the answer id after their first token."""
        banned = (skill == Skill.TEXT) & (token_index > 0)
        logits[:, self.answer].masked_fill_(banned, float("-inf"))

    def spatial(self, tokens: torch.Tensor, hidden: torch.Tensor, skill: torch.Tensor, token_index: torch.Tensor,
                rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A step's sampled tokens -> (the tokens reported, the ids the next forward embeds, the bins
        [rows, 3] decoded from each row's hidden state), point/detect rows advanced one state."""
        spatial = skill >= Skill.POINT
        state = torch.where(token_index == 0, STATE_X, self.spatial_state[rows])
        ends = (state == STATE_X) & (tokens == self.eos)
        size = state == STATE_S
        reported = torch.where(spatial, torch.where(ends, tokens, torch.where(size, self.size, self.coord)), tokens)
        bins = self.region.decode(hidden)
        emb = torch.where(size[:, None], self.region.encode_size(bins[:, 1:]), self.region.encode_coord(bins[:, 0]))
        self.text.model.embed_tokens.weight.index_copy_(0, self.vocab + rows, emb)
        after = torch.where(state == STATE_X, STATE_Y,
                            torch.where((state == STATE_Y) & (skill == Skill.DETECT), STATE_S, STATE_X))
        self.spatial_state.index_copy_(0, rows, torch.where(spatial, after, state))
        next_ids = torch.where(spatial & ~ends, self.vocab + rows, reported)
        return reported, next_ids, bins


def prefix_slots(pages: list[list[int]], page_size: int) -> np.ndarray:
    """The KV slots of positions 0..729 in each of these prefixes' pages, concatenated."""
    pos = np.arange(PREFIX_LEN)
    table = np.asarray(pages, dtype=np.int64).reshape(len(pages), -1)
    return (table[:, pos // page_size] * page_size + pos % page_size).reshape(-1)
