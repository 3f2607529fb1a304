"""Tests for the model zoo: architectures, sizes, initialisation, errors and user factories."""

from __future__ import annotations

import sys
import textwrap
import uuid

import pytest
import torch
from torch import nn

from scaletrain.errors import UserError
from scaletrain.models import build_model, model_names
from scaletrain.perf.flops import count_params, forward_flops
from scaletrain.models.cifar_resnet import CifarBlock, CifarResNet
from scaletrain.models.registry import minimum_image_size
from scaletrain.models.resnet import BasicBlock, Bottleneck

ALL = ["alexnet", "lenet5", "mlp", "resnet18", "resnet20", "resnet34", "resnet50", "resnet56", "vgg11", "vgg16"]


def meta_build(name: str, **kw) -> nn.Module:
    """Build on the meta device: shapes and parameter counts without allocating or initialising memory."""
    with torch.device("meta"):
        return build_model(name, **kw)


def run(model: nn.Module, batch: int, channels: int, size: int) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(torch.randn(batch, channels, size, size))


def test_names_are_exactly_the_registry():
    assert model_names() == sorted(ALL)


@pytest.mark.parametrize("name, kw, expected", [
    ("resnet18", dict(image_size=224, stem="imagenet"), 11_689_512),
    ("resnet34", dict(image_size=224, stem="imagenet"), 21_797_672),
    ("resnet50", dict(image_size=224, stem="imagenet"), 25_557_032),
    ("vgg11", dict(image_size=224), 132_868_840),
    ("vgg16", dict(image_size=224), 138_365_992),
    ("alexnet", dict(image_size=224), 61_100_840),
])
def test_imagenet_param_counts(name, kw, expected):
    assert count_params(meta_build(name, num_classes=1000, in_channels=3, **kw)) == expected


def test_stem_auto_picks_imagenet_above_64_px():
    # resnet50 at 224 with the default stem must be the published 25.56 M model.
    model = meta_build("resnet50", num_classes=1000, in_channels=3, image_size=224)
    assert count_params(model) == 25_557_032
    assert any(isinstance(m, nn.MaxPool2d) for m in model.stem)


@pytest.mark.parametrize("size, has_maxpool", [(64, False), (65, True)])
def test_stem_auto_threshold(size, has_maxpool):
    model = meta_build("resnet18", num_classes=10, in_channels=3, image_size=size)
    assert any(isinstance(m, nn.MaxPool2d) for m in model.stem) == has_maxpool
    assert model.stem[0].kernel_size == ((7, 7) if has_maxpool else (3, 3))


def test_cifar_resnet_param_counts():
    # The paper's option-A shortcuts carry no parameters: 269,722 / 853,018.
    assert count_params(build_model("resnet20", num_classes=10, in_channels=3, image_size=32)) == 269_722
    assert count_params(meta_build("resnet56", num_classes=10, in_channels=3, image_size=32)) == 853_018
    assert not any(isinstance(m, nn.Conv2d) and m.kernel_size == (1, 1)
                   for m in meta_build("resnet20", num_classes=10, in_channels=3, image_size=32).modules())


def test_cifar_resnet_option_b_matches_the_often_quoted_counts():
    # 272,474 / 855,770 (e.g. Keras ResNet20v1) are option B: 1x1 projection shortcuts add 2,752 params.
    with torch.device("meta"):
        assert count_params(CifarResNet(20, shortcut="B")) == 272_474
        assert count_params(CifarResNet(56, shortcut="B")) == 855_770


def test_lenet5_param_count_and_flops():
    model = build_model("lenet5", num_classes=10, in_channels=1, image_size=32)
    assert count_params(model) == 61_706
    # conv1 6*25*28^2 + conv2 16*6*25*10^2 + fc 400*120+120*84+84*10 multiply-adds, 2 FLOPs each.
    assert forward_flops(model, (1, 32, 32)) == 2 * (6 * 25 * 784 + 16 * 150 * 100 + 48_000 + 10_080 + 840)


def test_resnet18_flops_at_224():
    model = build_model("resnet18", num_classes=1000, in_channels=3, image_size=224)
    model.train()
    flops = forward_flops(model, (3, 224, 224))
    assert abs(flops - 3.64e9) / 3.64e9 < 0.02
    assert model.training  # forward_flops restores the mode it found


def test_forward_flops_is_per_sample_and_device_agnostic():
    real = build_model("resnet20", num_classes=10, in_channels=3, image_size=32)
    meta = meta_build("resnet20", num_classes=10, in_channels=3, image_size=32)
    assert forward_flops(real, (3, 32, 32)) == forward_flops(meta, (3, 32, 32)) > 0
    assert forward_flops(meta, (3, 64, 64)) > 3.9 * forward_flops(meta, (3, 32, 32))


# Small sizes and widths keep every forward cheap on two CPU cores.
FORWARD_CASES = [
    ("resnet18", 16, {}), ("resnet18", 72, dict(stem="imagenet", width=0.25)),
    ("resnet34", 16, dict(width=0.25)), ("resnet50", 16, dict(width=0.25)),
    ("resnet20", 32, {}), ("resnet56", 16, {}),
    ("vgg11", 32, dict(width=0.25)), ("vgg16", 32, dict(width=0.25)), ("vgg11", 64, dict(width=0.0625)),
    ("alexnet", 64, dict(width=0.125)), ("lenet5", 28, {}), ("mlp", 28, {}),
]


@pytest.mark.parametrize("name, size, kw", FORWARD_CASES)
@pytest.mark.parametrize("channels", [3, 1])
def test_forward_shape(name, size, kw, channels):
    model = build_model(name, num_classes=7, in_channels=channels, image_size=size, **kw)
    out = run(model, 2, channels, size)
    assert out.shape == (2, 7)
    assert torch.isfinite(out).all()


def test_backward_runs_in_train_mode():
    model = build_model("resnet20", num_classes=10, in_channels=3, image_size=16)
    model(torch.randn(4, 3, 16, 16)).sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_vgg_head_switches_at_64_px():
    small = meta_build("vgg11", num_classes=10, in_channels=3, image_size=63)
    classic = meta_build("vgg11", num_classes=10, in_channels=3, image_size=64)
    assert [type(m) for m in small.classifier] == [nn.Linear]
    assert small.classifier[0].in_features == 512
    assert sum(isinstance(m, nn.Dropout) for m in classic.classifier) == 2
    assert classic.classifier[0].out_features == 4096


@pytest.mark.parametrize("name", ALL)
def test_half_width_reduces_params(name):
    kw = dict(num_classes=10, in_channels=3, image_size=64)
    full, half = count_params(meta_build(name, **kw)), count_params(meta_build(name, width=0.5, **kw))
    assert half < full
    assert count_params(meta_build(name, width=2, **kw)) > full


def test_width_scales_channels():
    model = meta_build("resnet20", num_classes=10, in_channels=3, image_size=32, width=0.5)
    assert model.fc.in_features == 32
    assert meta_build("mlp", num_classes=10, in_channels=1, image_size=8, width=0.001).net[1].out_features == 1


@pytest.mark.parametrize("name, block_types", [
    ("resnet18", (BasicBlock,)), ("resnet50", (Bottleneck,)), ("cifar-A", (CifarBlock,)),
])
def test_zero_init_residual_makes_blocks_shortcuts(name, block_types):
    torch.manual_seed(0)
    if name == "cifar-A":
        model = CifarResNet(20, width=0.25, zero_init_residual=True).eval()
    else:
        model = build_model(name, num_classes=10, in_channels=3, image_size=16, width=0.25).eval()
    blocks = [m for m in model.modules() if isinstance(m, block_types)]
    assert blocks
    x = torch.relu(torch.randn(2, blocks[0].conv1.in_channels, 8, 8))
    with torch.no_grad():
        for block in blocks:
            assert torch.count_nonzero(block.residual(x)) == 0
            expected = torch.relu(block.shortcut(x))
            assert torch.equal(block(x), expected)
            x = expected + 0.1  # a non-trivial input for the next block, with its channel count


def test_residual_branch_is_nonzero_without_zero_init():
    # Guards the test above: the branch is only zero because of the zero-initialised gamma.
    # The registry's resnet20 leaves it off (option-A shortcuts then barely train).
    model = build_model("resnet20", num_classes=10, in_channels=3, image_size=32).eval()
    with torch.no_grad():
        assert torch.count_nonzero(model.layer1[0].residual(torch.randn(1, 16, 8, 8))) > 0


def test_convs_get_kaiming_fan_out_init():
    torch.manual_seed(0)
    model = build_model("resnet18", num_classes=10, in_channels=3, image_size=32)
    weight = model.layer4[1].conv2.weight  # 512x512x3x3: fan_out = 512*9
    assert abs(weight.std().item() - (2 / (512 * 9)) ** 0.5) < 0.02 * (2 / (512 * 9)) ** 0.5


def test_known_minimum_sizes():
    sizes = {n: minimum_image_size(n, image_size=224) for n in ALL}
    assert sizes["alexnet"] == 63 and sizes["lenet5"] == 16 and sizes["vgg11"] == sizes["vgg16"] == 32
    assert sizes["resnet18"] == sizes["resnet20"] == sizes["mlp"] == 1


@pytest.mark.parametrize("name, stem", [(n, "auto") for n in ALL] + [("resnet18", "imagenet"), ("resnet50", "cifar")])
def test_minimum_size_is_exact(name, stem):
    minimum = minimum_image_size(name, image_size=1, stem=stem)
    model = build_model(name, num_classes=3, in_channels=3, image_size=minimum, stem=stem, width=0.125)
    assert run(model, 1, 3, minimum).shape == (1, 3)
    if minimum > 1:
        with pytest.raises(UserError, match=rf"^{name} needs images of at least {minimum}x{minimum} \(got {minimum - 1}\)"):
            build_model(name, num_classes=3, in_channels=3, image_size=minimum - 1, stem=stem)


def test_alexnet_size_message():
    with pytest.raises(UserError) as err:
        build_model("alexnet", num_classes=10, in_channels=3, image_size=32)
    assert str(err.value) == "alexnet needs images of at least 63x63 (got 32): use --image-size 64 or another model"


def test_unknown_name_suggests_closest():
    with pytest.raises(UserError) as err:
        build_model("resnt20", num_classes=10, in_channels=3, image_size=32)
    assert str(err.value) == ("unknown model 'resnt20': did you mean 'resnet20'? Run `scaletrain models` "
                              "to list them, or pass package.module:factory")
    with pytest.raises(UserError, match=r"^unknown model 'transformer'\. Run `scaletrain models`"):
        build_model("transformer", num_classes=10, in_channels=3, image_size=32)


@pytest.mark.parametrize("kw, pattern", [
    (dict(stem="tiny"), r"unknown stem 'tiny': use one of auto, imagenet, cifar"),
    (dict(width=0), r"width must be a positive number \(got 0\)"),
    (dict(width=-1.5), r"width must be a positive number"),
    (dict(width=float("nan")), r"width must be a positive number"),
    (dict(width="2"), r"width must be a positive number"),
    (dict(num_classes=0), r"num_classes must be a positive integer"),
    (dict(in_channels=2.0), r"in_channels must be a positive integer"),
    (dict(image_size=True), r"image_size must be a positive integer"),
])
def test_invalid_arguments(kw, pattern):
    args = dict(num_classes=10, in_channels=3, image_size=32) | kw
    with pytest.raises(UserError, match=pattern) as err:
        build_model("resnet18", **args)
    assert "\n" not in str(err.value)


def test_stem_only_for_imagenet_family_resnets():
    with pytest.raises(UserError, match=r"^vgg11 has a fixed stem; --stem cifar applies only to resnet18, resnet34, resnet50"):
        build_model("vgg11", num_classes=10, in_channels=3, image_size=32, stem="cifar")


# ---- user factories ---------------------------------------------------------------------------

@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """Write `source` to a uniquely named module on sys.path and return its name."""
    monkeypatch.syspath_prepend(str(tmp_path))
    names = []

    def write(source: str) -> str:
        name = f"st_user_{uuid.uuid4().hex[:10]}"
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        names.append(name)
        return name

    yield write
    for name in names:
        sys.modules.pop(name, None)


FACTORIES = """
    from torch import nn

    def only_classes(num_classes):
        return nn.Linear(4, num_classes)

    def everything(**kwargs):
        global SEEN
        SEEN = kwargs
        return nn.Linear(4, kwargs["num_classes"])

    def defaults(in_channels=1, width=8, *, image_size=None):
        global SEEN
        SEEN = dict(in_channels=in_channels, width=width, image_size=image_size)
        return nn.Conv2d(in_channels, width, 3)

    class Net(nn.Module):
        def __init__(self, num_classes, in_channels):
            super().__init__()
            self.fc = nn.Linear(in_channels, num_classes)

    class Holder:
        @staticmethod
        def make():
            return nn.Identity()

    NOT_CALLABLE = 3

    def returns_list(num_classes):
        return [num_classes]

    def needs_depth(num_classes, depth):
        return nn.Linear(depth, num_classes)
"""


def test_user_factory_gets_only_accepted_kwargs(user_module):
    mod = user_module(FACTORIES)
    model = build_model(f"{mod}:only_classes", num_classes=5, in_channels=3, image_size=32)
    assert isinstance(model, nn.Linear) and model.out_features == 5
    model = build_model(f"{mod}:defaults", num_classes=5, in_channels=2, image_size=9)
    assert sys.modules[mod].SEEN == dict(in_channels=2, width=8, image_size=9)
    net = build_model(f"{mod}:Net", num_classes=4, in_channels=6, image_size=32)
    assert (net.fc.in_features, net.fc.out_features) == (6, 4)
    assert isinstance(build_model(f"{mod}:Holder.make", num_classes=4, in_channels=6, image_size=32), nn.Identity)


def test_user_factory_with_var_kwargs_gets_everything(user_module):
    mod = user_module(FACTORIES)
    build_model(f"{mod}:everything", num_classes=5, in_channels=3, image_size=32)
    assert sys.modules[mod].SEEN == dict(num_classes=5, in_channels=3, image_size=32)


def test_user_factory_errors(user_module):
    mod = user_module(FACTORIES)
    kw = dict(num_classes=5, in_channels=3, image_size=32)
    cases = [
        ("no_such_pkg_xyz.models:make", r"^cannot import module 'no_such_pkg_xyz\.models' .*ModuleNotFoundError.*PYTHONPATH"),
        (f"{mod}:missing", rf"^module '{mod}' has no attribute 'missing'"),
        (f"{mod}:NOT_CALLABLE", rf"^'{mod}:NOT_CALLABLE' is a int, not callable"),
        (f"{mod}:returns_list", rf"^factory '{mod}:returns_list' returned a list, not a torch\.nn\.Module"),
        (f"{mod}:needs_depth", r"requires 'depth', which scaletrain does not pass: give it a default"),
        (f"{mod}:", r"is not of the form package\.module:factory"),
    ]
    for spec, pattern in cases:
        with pytest.raises(UserError, match=pattern) as err:
            build_model(spec, **kw)
        assert "\n" not in str(err.value)


def test_user_module_that_fails_on_import(user_module):
    mod = user_module("raise RuntimeError('broken\\nconfig')\n")
    with pytest.raises(UserError, match=r"\(RuntimeError: broken config\): check the spelling") as err:
        build_model(f"{mod}:make", num_classes=5, in_channels=3, image_size=32)
    assert "\n" not in str(err.value)


def test_user_factory_rejects_builtin_only_options(user_module):
    mod = user_module(FACTORIES)
    with pytest.raises(UserError, match=r"--stem and --width apply only to built-in models"):
        build_model(f"{mod}:only_classes", num_classes=5, in_channels=3, image_size=32, width=0.5)
