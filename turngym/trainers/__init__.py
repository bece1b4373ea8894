"""trainers"""
