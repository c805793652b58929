"""LlamaGen's caption cleaning for the T5 path (lantern.models.text.captions) and its use by the T5 encoder."""

import pytest
import torch

from lantern.errors import ConfigError
from lantern.models.text.captions import MODES, clean_once, preprocess

# (caption, what LlamaGen's T5Embedder(use_text_preprocessing=True) hands its tokenizer), computed with
# LlamaGen's language/t5.py (commit 5a50452), ftfy 6.3.1 and beautifulsoup4 4.15.0.
KNOWN = [
    ("A photo of a red fox sitting in fresh snow.", "a photo of a red fox sitting in fresh snow."),
    ("A Man Riding A WAVE on top of a surfboard.", "a man riding a wave on top of a surfboard."),
    ("  Two dogs playing with a frisbee in the park  ", "two dogs playing with a frisbee in the park"),
    ("Visit https://example.com/path?x=1 for more photos of cats", "visit ?x=1 for more photos of cats"),
    ("See www.flickr.com/photos/123 and example.org today", "see and today"),
    ("<b>Bold</b> statement with <a href='x'>a link</a>", "bold statement with a link"),
    ("Photo by @john_doe at the beach", "photo by at the beach"),
    ("A temple in 京都 at dusk", "a temple in at dusk"),
    ("An em—dash and an en–dash and a −minus", "an em-dash and an en-dash and a −minus"),
    ("“Quoted” words and ‘single’ ones and «guillemets»", "quoted\" words and 'single' ones and \"guillemets"),
    ("Server at 192.168.0.1 is down", "server at is down"),
    ("Article 3:45   ", "article 3:45"),
    ("Line one\\nline two", "line one line two"),
    ("Tag #12 and #123456 and 1234567 numbers", "tag and and numbers"),
    ("Download image_01.jpg and photo.png now", "and now"),
    ('"""AUSVERKAUFT""" sale...', '"ausverkauft" sale'),
    (
        "***AUSVERKAUFT*** #SALE (limited) [edition] {rare} | best / worst \\ ok ~ © 2020 ® ™",
        "ausverkauft sale limited edition rare best worst ok 2020",
    ),
    ("this-is-my-cute-cat-photo", "this is my cute cat photo"),
    ("this_is_my_cute_cat", "this is my cute cat"),
    ("a well-known co-op", "a well-known co-op"),
    ("The cafÃ© on the corner", "the cafã on the corner"),
    ("Tom &amp; Jerry &quot;cartoon&quot; &lt;3", 'tom jerry "cartoon" <3'),
    ("Fish &amp;amp; chips", "fish ; chips"),
    ("Model jc6640 and jc6640vc and 6640vc231 and j2d1a2a", "model and and and"),
    ("Free shipping worldwide shipping free download now", "now"),
    ("Click for details and click on here", "and"),
    ("Wallpaper 1920x1080 and 3.5×2 and 4х2", "wallpaper and and"),
    ("Page 12 of the book", "of the book"),
    ("Hello,world.Then/now", "hello, world. then now"),
    ("Time : 5 pm", "time: 5 pm"),
    ("'A quoted caption'", "a quoted caption"),
    ("-leading dash and trailing plus+", "leading dash and trailing plus"),
    (".hidden", ""),
    ("a+b+c and 50%25 off %20space", "a b c and 50% off space"),
    ("<person> walking a dog", "person walking a dog"),
    ("Emoji 😀 smile and été accents", "emoji 😀 smile and été accents"),
    ("Кот на крыше", "кот на крыше"),
    ("Multiple     spaces\tand\ttabs\nand newline", "multiple spaces and tabs and newline"),
    ("A bowl of ramen with a soft-boiled egg, top view.", "a bowl of ramen with a soft-boiled egg, top view."),
    ("A lighthouse on a rocky cliff at sunset.", "a lighthouse on a rocky cliff at sunset."),
    ("A vintage bicycle leaning against a brick wall.", "a vintage bicycle leaning against a brick wall."),
    ("The pdf image and jpg images", "the and"),
    ("mail me at someone@example.com", "mail me at someone"),
    ("a picture of 10.5x20 cm size", "a picture of 10. cm size"),
    ("HTTP://EXAMPLE.COM/UPPER", ""),
    ("a shirt (size M) for $20!", "a shirt size m for $20!"),
    ("Half ½ and ¾ quarter, ¿que? ¡ole! § section", "half and quarter, que? ole! section"),
    ("A giraffe standing next to a tree . In the zoo", "a giraffe standing next to a tree in the zoo"),
    ("Bullets • and middots · here", "bullets and middots here"),
    ("A 'single' and \"double\" quoted word", "a 'single' and \"double\" quoted word"),
    ("ends with colon:", "ends with colon"),
    (";starts with semicolon", "starts with semicolon"),
    ("Japanese カタカナ and hangul 한글", "japanese カタカナ and hangul 한글"),
    ("CJK compat ㌀ and enclosed ㈀ and strokes ㇀", "cjk compat and enclosed and strokes"),
    ("a cat ... sleeping", "a cat sleeping"),
    ("rock'n'roll band", "rock'n'roll band"),
    ("", ""),
    ("   ", ""),
    ("A%20photo%20of%20a%20cat", "a photo of a cat"),
    ("A photo of a cat <script>alert(1)</script>", "a photo of a cat"),
]


@pytest.mark.parametrize("caption,expected", KNOWN)
def test_clean_matches_llamagens_known_outputs(caption, expected):
    assert preprocess(caption, "clean") == expected


def test_clean_runs_the_cleaner_twice_as_llamagen():
    # Each pass URL-decodes once: a doubly encoded '+' needs both (LlamaGen's output: 'a+b').
    caption = "a%252Bb"
    assert clean_once(caption) == "a%2bb" and preprocess(caption, "clean") == "a+b"


def test_the_other_modes():
    assert preprocess("  A RED Cat  ", "lower") == "a red cat"  # LlamaGen's use_text_preprocessing=False
    assert preprocess("  A RED Cat  ", "none") == "  A RED Cat  "
    assert MODES == ("clean", "lower", "none")
    with pytest.raises(ConfigError, match=r"^model\.text_preprocessing='upper': expected one of clean, lower, none"):
        preprocess("x", "upper")


@pytest.fixture(scope="module")
def t5_folder(tmp_path_factory):
    from helpers import tiny_t5_folder as _tiny_t5_folder

    return _tiny_t5_folder(tmp_path_factory.mktemp("t5"))


def test_t5_encoder_cleans_captions_by_default(t5_folder):
    from lantern.models.text.t5 import load_t5_encoder

    clean = load_t5_encoder(t5_folder, max_length=12)
    assert clean.preprocessing == "clean"
    shouted = clean.encode(["<b>A RED CAT</b>   on the MAT www.example.com/cat"])  # cleans to "a red cat on the mat"
    plain = clean.encode(["a red cat on the mat"])
    assert torch.equal(shouted.mask, plain.mask) and torch.equal(shouted.states, plain.states)
    raw = load_t5_encoder(t5_folder, max_length=12, preprocessing="none")
    assert not torch.equal(raw.encode(["<b>A RED CAT</b> on the mat"]).states, plain.states)
    assert torch.equal(raw.encode(["a red cat on the mat"]).states, plain.states)
    with pytest.raises(ConfigError, match="text_preprocessing='x'"):
        load_t5_encoder(t5_folder, preprocessing="x")


def test_t5_config_defaults_are_llamagens():
    from helpers import REPO
    from hydra import compose, initialize_config_dir

    for model in ("llamagen_t2i_xl_256", "llamagen_t2i_xl_512"):
        with initialize_config_dir(version_base="1.3", config_dir=str(REPO / "conf")):
            cfg = compose("config", overrides=[f"model={model}"])
        conditioner = cfg.model.bundle.conditioner
        assert conditioner.dtype == "bfloat16" and conditioner.preprocessing == "clean"
        with initialize_config_dir(version_base="1.3", config_dir=str(REPO / "conf")):
            cfg = compose(
                "config",
                overrides=[f"model={model}", "model.text_encoder_dtype=float32", "model.text_preprocessing=lower"],
            )
        assert cfg.model.bundle.conditioner.dtype == "float32" and cfg.model.bundle.conditioner.preprocessing == "lower"


def test_a_long_prompt_keeps_the_same_tokens_when_cut_early_and_warns_once(t5_folder, capsys):
    from lantern.models.condition import TextConditioner
    from lantern.models.text.t5 import load_t5_encoder

    encoder = load_t5_encoder(t5_folder, max_length=12)
    capsys.readouterr()
    words = "a red cat sits on the mat " * 40_000  # ~1 MB, far more than 12 tokens
    head = encoder.prepare(words)
    assert len(head) < 2000 and words.lower().startswith(head)
    ids_full = encoder.tokenizer([words.strip()], truncation=True, max_length=12)["input_ids"]
    ids_head = encoder.tokenizer([head], truncation=True, max_length=12)["input_ids"]
    assert ids_full == ids_head
    assert encoder.truncated(words) and not encoder.truncated("a red cat")
    conditioner = TextConditioner(encoder)
    conditioner.check_all([words, "a red cat", words, "the mat"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "warning: 1 of 3 distinct prompts are longer than the text encoder's 12"
    )
