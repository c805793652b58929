import torch

from lantern.models.llamagen.gpt import Transformer, gpt_config
from lantern.training.gpt import GPTObjective
from lantern.training.loop import EpochBatches, Trainer


def toy_problem(dropout=0.1):
    torch.manual_seed(0)
    model = Transformer(gpt_config("GPT-nano", "t2i", 16, downsample=4, vocab_size=32, caption_dim=6, cls_token_num=3))
    codes = torch.randint(0, 32, (8, 16))
    codes[:, 1::2] = codes[:, ::2]  # learnable structure: every odd token repeats the previous one
    states = torch.randn(4, 3, 6)
    masks = torch.tensor([[0, 1, 1], [1, 1, 1], [0, 0, 1], [1, 1, 1]], dtype=torch.bool)
    caption_ids = torch.tensor([[0, 1], [2, 3]] * 4)
    return model, GPTObjective(model, codes, caption_ids, states, masks, cond_dropout=dropout)


def test_gpt_objective_learns(tmp_path):
    model, objective = toy_problem()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first, _ = objective(torch.arange(8))
    trainer = Trainer(
        model,
        optimizer,
        objective,
        EpochBatches(8, 8, 0, lambda idx: idx),
        max_steps=40,
        out_dir=tmp_path,
        ckpt_every=40,
        log_every=10,
        progress=False,
    )
    trainer.fit()
    with torch.no_grad():
        last, logs = objective(torch.arange(8))
    assert last.item() < 0.7 * first.item()
    assert (tmp_path / "model.safetensors").is_file()


def test_condition_dropout_uses_the_null_caption():
    model, objective = toy_problem(dropout=1.0)
    seen = []
    handle = model.cls_embedding.cap_proj.register_forward_hook(lambda m, args, out: seen.append(args[0]))
    objective(torch.arange(4))
    handle.remove()
    expected = model.null_condition(4)
    torch.testing.assert_close(seen[0], expected)
