"""GENERATED ONLY: protobuf/gRPC modules built from proto/ by scripts/gen_proto.py.

Do not edit; change the .proto files and rerun the script."""
