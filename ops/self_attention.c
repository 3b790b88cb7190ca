/* self_attention.c — being written */
