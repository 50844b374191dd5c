"""The shared geometry check battery, over every registered geometry."""

import numpy as np
import pytest

import anchordiv as ad
from anchordiv.models import registry
from anchordiv.testing import check_geometry, geometry_checks

from conftest import GEOMETRY_PARAMS

pytestmark = pytest.mark.numeric


def factory(name):
    return lambda: ad.make_model(name, **GEOMETRY_PARAMS[name])


def test_every_registered_geometry_has_test_parameters():
    assert set(GEOMETRY_PARAMS) == set(registry())


@pytest.mark.parametrize("check", [c for name in GEOMETRY_PARAMS for c in geometry_checks(factory(name))], ids=str)
def test_battery(check):
    check()


class BrokenCosine(ad.Cosine):
    """Its feature maps break the contract: pairwise no longer matches o − φψᵀ."""

    def pairwise(self, Q, G, symmetric=True):
        return super().pairwise(Q, G, symmetric) + 1e-3


def test_battery_catches_a_broken_geometry(monkeypatch):
    monkeypatch.setattr("anchordiv.models._USER_MODELS", {"broken_cosine": BrokenCosine})
    with pytest.raises(AssertionError, match="check_feature_contract: pairwise"):
        check_geometry(BrokenCosine)


def test_battery_requires_registration_for_index_files():
    class Unregistered(ad.Cosine):
        pass

    with pytest.raises(AssertionError, match="check_index_round_trip: Unregistered is not registered"):
        check_geometry(Unregistered)
