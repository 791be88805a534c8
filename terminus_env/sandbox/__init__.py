"""sandbox"""
