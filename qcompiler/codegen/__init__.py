"""qcompiler.codegen"""
