"""/v1/plans: ask the planner without submitting anything."""

from __future__ import annotations

from fastapi import APIRouter

from planner.schemas import PlanResult
from service.auth.deps import USERS
from service.plans.schemas import PlanRequest
from service.plans.service import plan_request

router = APIRouter(prefix="/v1/plans", tags=["plans"], dependencies=[USERS])


@router.post("")
def create_plan(req: PlanRequest) -> PlanResult:
    """The best layout for a run, its memory, speed and failure plan, and what was rejected."""
    return plan_request(req)
