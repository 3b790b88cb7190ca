/* attention.c — being written */
