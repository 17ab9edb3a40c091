"""The Kopf operator that reconciles ``JudgeQueue`` resources into Deployments, status and queue flags."""
