"""Pure decisions: standard library and raytrain.spec only. No torch, ray, boto3, clock or env.

Every function here is a function of its arguments, so it is tested with plain values.
"""
