"""/v1/plans: ask the planner without submitting anything, and see how right it was."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from planner.schemas import CalibrationApplied, PlanResult
from service.auth.deps import USERS, PrincipalDep
from service.config import get_settings
from service.db import SessionDep
from service.plans.accuracy import accuracy_report
from service.plans.history import cluster_calibration
from service.plans.schemas import AccuracyReport, PlanRequest
from service.plans.service import plan_request

router = APIRouter(prefix="/v1/plans", tags=["plans"], dependencies=[USERS])


@router.post("")
def create_plan(req: PlanRequest, session: SessionDep) -> PlanResult:
    """The best layout for a run, its memory, speed and failure plan, and what was rejected."""
    return plan_request(session, get_settings(), req)


@router.get("/calibration")
def get_calibration(session: SessionDep) -> CalibrationApplied:
    """The corrections this cluster's own measured runs give the planner, and from how many."""
    settings = get_settings()
    return cluster_calibration(session, settings).applied_schema(settings.hardware)


@router.get("/accuracy")
def get_accuracy(
    session: SessionDep,
    principal: PrincipalDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> AccuracyReport:
    """Each run's predicted against measured figures, and the error per model size and
    layout family (the caller's team's runs; an admin's: every team's)."""
    team = None if principal.is_admin else principal.team
    return accuracy_report(session, get_settings(), team, limit)
