"""SageMaker as a platform: the instance types, and the client-side check of a planned training job."""
