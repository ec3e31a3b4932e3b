"""qcompiler.frontend"""
