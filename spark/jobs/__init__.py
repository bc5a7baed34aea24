"""Entry scripts of the Spark jobs, as spark-submit and a SparkApplication name them
(`local:///opt/capstan/jobs/<job>.py` in the Spark image, spark/Dockerfile)."""
