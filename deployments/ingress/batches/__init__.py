"""The OpenAI Batch API inside the ingress: files, batches, their store and the dispatcher
that runs a batch's lines as batch-class requests (docs/api.md, "Batch jobs")."""
